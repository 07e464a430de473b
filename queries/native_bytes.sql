-- native_bytes: what the native metrics (no connector trace) can say about padding.
--
-- An interval reports n successful reads and their bytes: exactly from Prometheus (the
-- growth of vllm:nixl_bytes_transferred_sum), or from the log's `Avg MB per transfer`,
-- which vLLM rounds to 3 decimals of a MiB (each read's share is known to ±0.0005 MiB).
-- Every read moves whole attention blocks plus one state snapshot, so with P the bytes of
-- one attention block on one rank and S its unpadded state:
--     total − n·S                is a multiple of P when the state crossed unpadded,
--     total − n·S_padded         is a multiple of P when it crossed as padded pages.
-- Exactly one holding decides the question; both holding (n·(S_padded − S) is itself a
-- multiple of P, or within the log's rounding) means this data cannot tell; neither
-- means something else moved (staging copies, unsharded state, other models).
-- It assumes decode and prefill engines of equal TP (one read per rank and request).

-- interval_bytes: the verdict of every interval of an engine the byte model can size.
--
-- Columns:
--   engine_id, source_kind, start_ts, end_ts, transfers     the interval
--   total_bytes        bytes the interval reports (exact for Prometheus, estimated for logs)
--   tolerance_bytes    how far the log's rounding can put total_bytes off (0 for Prometheus)
--   block_bytes        P: one attention block of one rank (block_tokens × B)
--   state_bytes        S; padded_state_bytes: S as padded pages
--   clean_off_bytes    distance of total − n·S from the nearest multiple of P
--   padded_off_bytes   distance of total − n·S_padded from the nearest multiple of P
--   verdict            'unpadded', 'padded', 'undecidable' or 'unexplained'
CREATE OR REPLACE VIEW interval_bytes AS
WITH sized AS (
    SELECT i.engine_id, i.source_kind, i.start_ts, i.end_ts, i.transfers,
           coalesce(CAST(i.transported_bytes AS DOUBLE), i.avg_mib_per_transfer * 1048576.0 * i.transfers) AS total_bytes,
           CASE WHEN i.transported_bytes IS NOT NULL THEN 0.0 ELSE i.transfers * 0.0005 * 1048576.0 + 1 END
               AS tolerance_bytes,
           m.block_tokens * m.attention_bytes_per_token AS block_bytes,
           m.state_bytes,
           m.mamba_padded_page_bytes * m.recurrent_layers AS padded_state_bytes
    FROM intervals i
    JOIN engine_models m ON m.engine_id = i.engine_id AND m.error IS NULL
    WHERE i.transfers > 0 AND m.block_tokens IS NOT NULL AND m.state_bytes > 0
),
offsets AS (
    SELECT *,
           least(fmod(total_bytes - transfers * state_bytes, block_bytes),
                 block_bytes - fmod(total_bytes - transfers * state_bytes, block_bytes)) AS clean_off_bytes,
           least(fmod(total_bytes - transfers * padded_state_bytes, block_bytes),
                 block_bytes - fmod(total_bytes - transfers * padded_state_bytes, block_bytes)) AS padded_off_bytes
    FROM sized
)
SELECT *,
       CASE WHEN clean_off_bytes <= tolerance_bytes AND padded_off_bytes <= tolerance_bytes THEN 'undecidable'
            WHEN clean_off_bytes <= tolerance_bytes THEN 'unpadded'
            WHEN padded_off_bytes <= tolerance_bytes THEN 'padded'
            ELSE 'unexplained' END AS verdict
FROM offsets;

-- finding_native_padding: padding judged per engine from native metrics, for engines the
-- connector trace does not cover (the trace's per-read accounting is finer). One finding
-- per engine and source kind: 'padding_leak' when intervals show padded state, an 'info'
-- finding saying the question cannot be decided when block rounding hides it.
CREATE OR REPLACE VIEW finding_native_padding AS
SELECT
    CASE WHEN count(*) FILTER (WHERE verdict = 'padded') > 0 THEN 'padding_leak' ELSE 'padding_undecidable' END
        AS kind,
    CASE WHEN count(*) FILTER (WHERE verdict = 'padded') > 0 THEN 'warning' ELSE 'info' END AS severity,
    engine_id, CAST(NULL AS INTEGER) AS rank, CAST(NULL AS VARCHAR) AS request_id,
    CAST(NULL AS VARCHAR) AS remote_engine_id, min(start_ts) AS start_ts, max(end_ts) AS end_ts,
    CASE WHEN count(*) FILTER (WHERE verdict = 'padded') > 0
         THEN count(*) FILTER (WHERE verdict = 'padded') || ' of ' || count(*) || ' ' || source_kind
              || ' intervals show the recurrent state crossing as padded pages'
         ELSE 'block rounding hides padding in these ' || source_kind
              || ' intervals: this data cannot tell whether the state crossed padded' END AS message,
    CAST(json_object('source', source_kind, 'intervals', count(*),
        'padded', count(*) FILTER (WHERE verdict = 'padded'),
        'unpadded', count(*) FILTER (WHERE verdict = 'unpadded'),
        'undecidable', count(*) FILTER (WHERE verdict = 'undecidable'),
        'unexplained', count(*) FILTER (WHERE verdict = 'unexplained'),
        'block_bytes', any_value(block_bytes), 'state_bytes', any_value(state_bytes),
        'padded_state_bytes', any_value(padded_state_bytes)) AS VARCHAR) AS evidence
FROM interval_bytes
WHERE engine_id NOT IN (SELECT DISTINCT engine_id FROM transfers)
GROUP BY engine_id, source_kind
HAVING count(*) FILTER (WHERE verdict = 'padded') > 0
    OR count(*) FILTER (WHERE verdict = 'undecidable') = count(*);
