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

-- _engine_tp(tp_size, ts, source_kind): an engine's TP size over its `engines` records (an
-- aggregate): the newest trace record's, else the most workers a log showed (a lower
-- bound), as engine_models sizes it.
CREATE OR REPLACE MACRO _engine_tp(tp, ts, kind) AS
    coalesce(arg_max(tp, ts) FILTER (WHERE kind = 'trace' AND tp IS NOT NULL), max(tp));

-- _engine_block(block_tokens, groups, ts): the attention block an engine reports over its
-- records (an aggregate): the newest logged or recorded block, else the largest block of
-- its trace records' attention groups.
CREATE OR REPLACE MACRO _engine_block(block, groups, ts) AS
    coalesce(arg_max(block, ts) FILTER (WHERE block IS NOT NULL), max(list_max([
        g.block_tokens FOR g IN json_transform(groups, '[{"kind": "VARCHAR", "block_tokens": "BIGINT"}]')
        IF g.kind <> 'mamba'])));
