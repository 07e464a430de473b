-- _macros: helpers shared by the query modules.
-- include:
--
-- _t(name): the value of a finding threshold from the _thresholds table (created by the
-- analyzer from its defaults and hybridtrace.toml before the views are installed).
CREATE OR REPLACE MACRO _t(n) AS (SELECT value FROM _thresholds WHERE name = n);

-- _rank_count(rank): how many distinct ranks an aggregate saw, as a bit set (ranks 0..126,
-- far beyond any TP size). Three times faster than count(DISTINCT rank) per request.
CREATE OR REPLACE MACRO _rank_count(rank) AS
    CAST(bit_count(bit_or(CASE WHEN rank BETWEEN 0 AND 126 THEN CAST(1 AS HUGEINT) << CAST(rank AS HUGEINT) END))
         AS BIGINT);

-- _share(tp_size, remote_tp_size): how many reads a decode rank makes of one request; null
-- for a TP size below 1 (ingest rejects those; an older store may hold them).
CREATE OR REPLACE MACRO _share(tp_size, remote_tp_size) AS
    CASE WHEN tp_size >= 1 AND remote_tp_size >= 1 THEN greatest(1, remote_tp_size // tp_size) END;
