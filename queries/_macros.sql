-- _macros: helpers shared by the query modules.
-- include:
--
-- _t(name): the value of a finding threshold from the _thresholds table (created by the
-- analyzer from its defaults and hybridtrace.toml before the views are installed).
CREATE OR REPLACE MACRO _t(n) AS (SELECT value FROM _thresholds WHERE name = n);

-- _rank_count(rank): how many distinct ranks an aggregate saw, as a bit set (ranks 0..126,
-- far beyond any TP size); null when it saw none. Three times faster than count(DISTINCT
-- rank) per request. Two 64-bit sets, not one 128-bit set: HUGEINT arithmetic made this a
-- fifth of the time of grouping every read by request.
CREATE OR REPLACE MACRO _rank_count(rank) AS
    nullif(
        coalesce(CAST(bit_count(bit_or(CASE WHEN rank BETWEEN 0 AND 63
                                            THEN CAST(1 AS UBIGINT) << CAST(rank AS UBIGINT) END)) AS BIGINT), 0)
        + coalesce(CAST(bit_count(bit_or(CASE WHEN rank BETWEEN 64 AND 126
                                              THEN CAST(1 AS UBIGINT) << CAST(rank - 64 AS UBIGINT) END)) AS BIGINT),
                   0),
        0);

-- _share(tp_size, remote_tp_size): how many reads a decode rank makes of one request; null
-- for a TP size below 1 (ingest rejects those; an older store may hold them).
CREATE OR REPLACE MACRO _share(tp_size, remote_tp_size) AS
    CASE WHEN tp_size >= 1 AND remote_tp_size >= 1 THEN greatest(1, remote_tp_size // tp_size) END;

-- _json_int(x): an integer (a sum: HUGEINT) as a JSON value for json_object, the same text.
-- A 64-bit integer converts to JSON five times faster than a 128-bit one, and every byte sum
-- in a finding's evidence is a 128-bit sum of 64-bit counts: the rules spent most of their
-- time writing evidence. A value beyond 64 bits keeps its 128-bit conversion.
CREATE OR REPLACE MACRO _json_int(x) AS
    CASE WHEN x BETWEEN -9223372036854775808 AND 9223372036854775807 THEN to_json(CAST(x AS BIGINT))
         ELSE to_json(x) END;
