-- native_bytes: what the native metrics (no connector trace) can say about padding.
-- include: intervals, handoffs
--
-- An interval reports n successful reads and their bytes: exactly from Prometheus (the
-- growth of vllm:nixl_bytes_transferred_sum), or from the log's `Avg MB per transfer`,
-- which vLLM rounds to 3 decimals of a MiB (each read's share is known to ±0.0005 MiB).
-- Every read moves whole attention blocks plus one state snapshot, so with P the bytes of
-- one attention block on one rank and S its unpadded state:
--     total − n·S                is a multiple of P when the state crossed unpadded,
--     total − n·S_padded         is a multiple of P when it crossed as padded pages,
--     total − n·(S_padded + L)   is a multiple of P when the pages of the allocator's
--                                padding layers (L) crossed as well (a connector that
--                                sends whole state groups sends them).
-- Unpadded holding alone, or one of the padded readings alone, decides the question;
-- unpadded and a padded reading both holding (their difference is itself a multiple of
-- P, or within the log's rounding) means this data cannot tell; none holding means
-- something else moved (staging copies, unsharded state, other models).
-- It assumes decode and prefill engines of equal TP (one read per rank and request).

-- _block_offset(x, p): how far x is from the nearest multiple of p (x may be negative).
CREATE OR REPLACE MACRO _block_offset(x, p) AS
    least(fmod(fmod(x, p) + p, p), p - fmod(fmod(x, p) + p, p));

-- _interval_verdicts(excluded): interval_bytes (below) of the engines not in the list `excluded`.
CREATE OR REPLACE MACRO _interval_verdicts(excluded) AS TABLE
WITH sized AS (
    -- a key of its own: the first log interval has no start, and NULL never joins
    SELECT row_number() OVER () AS interval_key,
           i.engine_id, i.source_kind, i.start_ts, i.end_ts, i.transfers,
           coalesce(CAST(i.transported_bytes AS DOUBLE), i.avg_mib_per_transfer * 1048576.0 * i.transfers)
               AS total_bytes,
           CASE WHEN i.transported_bytes IS NOT NULL THEN 0.0 ELSE i.transfers * 0.0005 * 1048576.0 + 1 END
               AS tolerance_bytes,
           m.block_tokens * m.attention_bytes_per_token AS block_bytes,
           m.state_bytes,
           m.mamba_padded_page_bytes * m.recurrent_layers AS padded_state_bytes,
           m.mamba_padded_page_bytes * coalesce(m.padding_layers, 0) AS padding_layers_bytes
    FROM intervals i
    JOIN engine_models m ON m.engine_id = i.engine_id AND m.error IS NULL
    WHERE i.transfers > 0 AND m.block_tokens IS NOT NULL AND m.state_bytes > 0
      AND NOT list_contains(excluded, i.engine_id)
),
fits AS (
    SELECT interval_key,
           list(m ORDER BY m) FILTER (
               WHERE _block_offset(total_bytes - transfers * state_bytes - m * (padded_state_bytes - state_bytes),
                                   block_bytes) <= tolerance_bytes
           ) AS fitting
    -- only where all-or-nothing does not fit: the search costs one row per read
    FROM (
        SELECT *, unnest(range(1, transfers)) AS m FROM sized
        WHERE _block_offset(total_bytes - transfers * state_bytes, block_bytes) > tolerance_bytes
          AND _block_offset(total_bytes - transfers * padded_state_bytes, block_bytes) > tolerance_bytes
          AND NOT coalesce(padding_layers_bytes > 0 AND _block_offset(
                  total_bytes - transfers * (padded_state_bytes + padding_layers_bytes), block_bytes)
              <= tolerance_bytes, false)
    )
    GROUP BY interval_key
)
SELECT * EXCLUDE (interval_key, any_padded_fit, layers_fit),
       NOT padded_fit AND layers_fit AS with_padding_layers,
       CASE WHEN clean_fit AND any_padded_fit THEN NULL
            WHEN clean_fit THEN 0
            WHEN any_padded_fit THEN transfers
            WHEN fitting_counts = 1 THEN fitting[1] END AS padded_reads,
       CASE WHEN clean_fit AND any_padded_fit THEN 'undecidable'
            WHEN clean_fit THEN 'unpadded'
            WHEN any_padded_fit THEN 'padded'
            WHEN fitting_counts = 1 THEN 'partly padded'
            WHEN fitting_counts > 1 THEN 'undecidable'
            ELSE 'unexplained' END AS verdict
FROM (
    SELECT *, padded_fit OR layers_fit AS any_padded_fit
    FROM (
        SELECT s.*,
               _block_offset(s.total_bytes - s.transfers * s.state_bytes, s.block_bytes) AS clean_off_bytes,
               _block_offset(s.total_bytes - s.transfers * s.padded_state_bytes, s.block_bytes)
                   AS padded_off_bytes,
               CASE WHEN s.padding_layers_bytes > 0 THEN _block_offset(
                   s.total_bytes - s.transfers * (s.padded_state_bytes + s.padding_layers_bytes), s.block_bytes)
               END AS layers_off_bytes,
               _block_offset(s.total_bytes - s.transfers * s.state_bytes, s.block_bytes) <= s.tolerance_bytes
                   AS clean_fit,
               _block_offset(s.total_bytes - s.transfers * s.padded_state_bytes, s.block_bytes)
                   <= s.tolerance_bytes AS padded_fit,
               coalesce(s.padding_layers_bytes > 0 AND _block_offset(
                   s.total_bytes - s.transfers * (s.padded_state_bytes + s.padding_layers_bytes), s.block_bytes)
                   <= s.tolerance_bytes, false) AS layers_fit,
               coalesce(f.fitting, []) AS fitting,
               coalesce(len(f.fitting), 0) AS fitting_counts
        FROM sized s
        LEFT JOIN fits f USING (interval_key)
    )
);

-- interval_bytes: the verdict of every interval of an engine the byte model can size.
--
-- The question is first all or nothing (every read padded, or none). When neither fits,
-- the view asks how many of the n reads could have sent padded state: m reads add
-- m·(S_padded − S), so it keeps the m in 1..n−1 for which total − n·S − m·(S_padded − S)
-- is a multiple of P. One value explains the interval; several mean the data cannot tell
-- them apart; none means something else moved.
--
-- @column engine_id             engine of the interval
-- @column source_kind           'log' or 'prometheus'
-- @column start_ts              interval start, epoch s
-- @column end_ts                interval end, epoch s
-- @column transfers             n: successful reads in the interval
-- @column total_bytes           bytes the interval reports (exact for Prometheus, estimated for logs)
-- @column tolerance_bytes       how far the log's rounding can put total_bytes off (0 for Prometheus)
-- @column block_bytes           P: one attention block of one rank (block_tokens × B)
-- @column state_bytes           S: one state snapshot of one rank, unpadded
-- @column padded_state_bytes    S as padded pages
-- @column padding_layers_bytes  L: the padding layers' pages of one state snapshot (0 without)
-- @column clean_off_bytes       distance of total − n·S from the nearest multiple of P
-- @column padded_off_bytes      distance of total − n·S_padded from the nearest multiple of P
-- @column layers_off_bytes      distance of total − n·(S_padded + L) from it (null without padding layers)
-- @column clean_fit             the unpadded reading fits (clean_off_bytes within the tolerance)
-- @column padded_fit            the padded reading fits
-- @column fitting               the partial counts m that fit, when all-or-nothing does not
-- @column fitting_counts        how many partial values of m fit
-- @column with_padding_layers   the padded reading that fits includes the padding layers' pages
-- @column padded_reads          reads that sent padded state: 0, n, the one partial m that fits, or
--                               null when the data cannot say
-- @column verdict               'unpadded', 'padded' (every read), 'partly padded', 'undecidable'
--                               or 'unexplained'
CREATE OR REPLACE VIEW interval_bytes AS SELECT * FROM _interval_verdicts([]);

-- _untraced_interval_bytes: interval_bytes of the engines the connector trace does not cover,
-- all the native rules read (the search over partial counts skips the others' intervals).
CREATE OR REPLACE VIEW _untraced_interval_bytes AS
SELECT * FROM _interval_verdicts((SELECT coalesce(list(DISTINCT engine_id), []) FROM transfers));

-- finding_native_padding: padding judged per engine from native metrics, for engines the
-- connector trace does not cover (the trace's per-read accounting is finer). One finding
-- per engine and source kind: 'padding_leak' when intervals show padded state, an 'info'
-- finding saying the question cannot be decided when block rounding hides it.
CREATE OR REPLACE VIEW finding_native_padding AS
SELECT
    CASE WHEN sum(padded_reads) > 0 THEN 'padding_leak' ELSE 'padding_undecidable' END AS kind,
    CASE WHEN sum(padded_reads) > 0 THEN 'warning' ELSE 'info' END AS severity,
    engine_id, CAST(NULL AS INTEGER) AS rank, CAST(NULL AS VARCHAR) AS request_id,
    CAST(NULL AS VARCHAR) AS remote_engine_id, min(start_ts) AS start_ts, max(end_ts) AS end_ts,
    CASE WHEN sum(padded_reads) > 0
         THEN sum(padded_reads) || ' of ' || sum(transfers) FILTER (WHERE verdict NOT IN ('undecidable', 'unexplained'))
              || ' reads in ' || source_kind || ' intervals that can be judged sent the recurrent state as padded pages'
              || CASE WHEN bool_or(with_padding_layers) THEN ', padding layers included' ELSE '' END
              || CASE WHEN count(*) FILTER (WHERE verdict = 'undecidable') > 0
                      THEN ' (' || count(*) FILTER (WHERE verdict = 'undecidable') || ' of ' || count(*)
                           || ' intervals cannot be judged: block rounding hides padding there)'
                      ELSE '' END
         ELSE 'block rounding hides padding in ' || count(*) FILTER (WHERE verdict = 'undecidable') || ' of '
              || count(*) || ' ' || source_kind
              || ' intervals: this data cannot tell whether the state crossed padded' END AS message,
    CAST(json_object('source', source_kind, 'intervals', count(*),
        'padded', count(*) FILTER (WHERE verdict = 'padded'),
        'with_padding_layers', count(*) FILTER (WHERE with_padding_layers),
        'partly_padded', count(*) FILTER (WHERE verdict = 'partly padded'),
        'padded_reads', sum(padded_reads), 'reads', sum(transfers),
        'unpadded', count(*) FILTER (WHERE verdict = 'unpadded'),
        'undecidable', count(*) FILTER (WHERE verdict = 'undecidable'),
        'unexplained', count(*) FILTER (WHERE verdict = 'unexplained'),
        'block_bytes', any_value(block_bytes), 'state_bytes', any_value(state_bytes),
        'padded_state_bytes', any_value(padded_state_bytes)) AS VARCHAR) AS evidence
FROM _untraced_interval_bytes
GROUP BY engine_id, source_kind
-- Undecidable intervals are said whenever nothing decided the question: no padded read and
-- no interval shown unpadded (unexplained intervals decide nothing).
HAVING sum(padded_reads) > 0
    OR (count(*) FILTER (WHERE verdict = 'undecidable') > 0
        AND count(*) FILTER (WHERE verdict = 'unpadded') = 0);

-- finding_native_unexplained: intervals whose bytes no reading of the engine's byte model
-- explains (neither whole blocks plus unpadded state, nor plus padded state, nor a mix).
-- For engines the connector trace does not cover. The usual cause is a wrong byte model
-- (config, TP size or dtypes attached to the engine), or traffic other than KV reads
-- counted by the transport; one finding per engine and source kind.
CREATE OR REPLACE VIEW finding_native_unexplained AS
SELECT
    'native_unexplained' AS kind, 'warning' AS severity,
    engine_id, CAST(NULL AS INTEGER) AS rank, CAST(NULL AS VARCHAR) AS request_id,
    CAST(NULL AS VARCHAR) AS remote_engine_id, min(start_ts) AS start_ts, max(end_ts) AS end_ts,
    count(*) FILTER (WHERE verdict = 'unexplained') || ' of ' || count(*) || ' ' || source_kind
        || ' intervals moved bytes the byte model cannot explain: check the model, TP and dtypes attached'
        AS message,
    CAST(json_object('source', source_kind, 'intervals', count(*),
        'unexplained', count(*) FILTER (WHERE verdict = 'unexplained'),
        'reads', sum(transfers) FILTER (WHERE verdict = 'unexplained'),
        'block_bytes', any_value(block_bytes), 'state_bytes', any_value(state_bytes),
        'padded_state_bytes', any_value(padded_state_bytes)) AS VARCHAR) AS evidence
FROM _untraced_interval_bytes
GROUP BY engine_id, source_kind
HAVING count(*) FILTER (WHERE verdict = 'unexplained') > 0;

-- _counted_events: failures and expiries vLLM's NIXL metrics counted, per engine.
-- Log intervals and Prometheus deltas count the same events, so the larger of the two
-- sums is kept, not their total.
CREATE OR REPLACE VIEW _counted_events AS
SELECT engine_id,
       max(failed) AS failed_counted, arg_max(source_kind, failed) AS failed_source,
       max(expired) AS expired_counted, arg_max(source_kind, expired) AS expired_source,
       min(start_ts) AS start_ts, max(end_ts) AS end_ts
FROM (
    SELECT engine_id, source_kind,
           coalesce(sum(failed_transfers), 0) AS failed, coalesce(sum(expired_requests), 0) AS expired,
           min(coalesce(start_ts, end_ts)) AS start_ts, max(end_ts) AS end_ts
    FROM intervals
    GROUP BY engine_id, source_kind
)
GROUP BY engine_id;

-- _named_trace_events: failures and expiries the trace names, per engine (event 'failed' or
-- 'expired'). Failures are counted per read on the decode side (a request recorded as failed
-- with no failed read counts once); expiries per request on the prefill side: a request the
-- trace records as expired, or one with an expired read, counts for its prefill engine. Each
-- count is a sum over requests: the incremental analysis keeps it in its state.
CREATE OR REPLACE VIEW _named_trace_events AS
SELECT engine_id, 'failed' AS event, count(*) AS named
FROM (
    SELECT engine_id FROM _unsuccessful_reads WHERE status = 'failed'
    UNION ALL
    -- both sides filtered before the anti join: a correlated NOT EXISTS costs twice as much
    SELECT engine_id
    FROM (SELECT engine_id, request_id FROM _unsuccessful_requests WHERE status = 'failed')
    ANTI JOIN (SELECT engine_id, request_id FROM _unsuccessful_reads WHERE status = 'failed') USING (engine_id, request_id)
)
GROUP BY engine_id
UNION ALL
SELECT remote_engine_id, 'expired', count(*)
FROM (
    SELECT remote_engine_id, engine_id, request_id FROM _unsuccessful_requests WHERE status = 'expired'
    UNION
    SELECT remote_engine_id, engine_id, request_id FROM _unsuccessful_reads WHERE status = 'expired'
)
GROUP BY remote_engine_id;

-- _named_events: failures and expiries a trace record or a log line names, per engine: the
-- trace's (_named_trace_events) or the log's, whichever names more.
CREATE OR REPLACE VIEW _named_events AS
SELECT engine_id,
       greatest(coalesce(max(failed_trace), 0), coalesce(max(failed_log), 0)) AS failed_named,
       greatest(coalesce(max(expired_trace), 0), coalesce(max(expired_log), 0)) AS expired_named
FROM (
    SELECT engine_id, named AS failed_trace, NULL AS failed_log, NULL AS expired_trace, NULL AS expired_log
    FROM _named_trace_events WHERE event = 'failed'
    UNION ALL
    SELECT engine_id, NULL, count(*), NULL, NULL
    FROM log_events WHERE kind = 'transfer_failed' GROUP BY engine_id
    UNION ALL
    SELECT engine_id, NULL, NULL, named, NULL FROM _named_trace_events WHERE event = 'expired'
    UNION ALL
    SELECT engine_id, NULL, NULL, NULL, count(DISTINCT request_id)
    FROM log_events WHERE kind IN ('kv_expired', 'kv_expired_declined') GROUP BY engine_id
)
GROUP BY engine_id;

-- finding_native_counters: failures or expiries the counters saw that no trace record or
-- log line names (native metrics only, or lines lost): one engine-scope finding per kind.
-- The per-request findings cover what is named; this covers the rest, so nothing counted
-- goes unreported. vLLM counts a completed read as failed when NIXL telemetry itself
-- errors (nixl issue 2266): the message says to check that first for failures.
CREATE OR REPLACE VIEW finding_native_counters AS
-- the named counts once, for both kinds
WITH n AS MATERIALIZED (SELECT * FROM _named_events)
SELECT
    'transfer_failed' AS kind, 'error' AS severity, c.engine_id, CAST(NULL AS INTEGER) AS rank,
    CAST(NULL AS VARCHAR) AS request_id, CAST(NULL AS VARCHAR) AS remote_engine_id, c.start_ts, c.end_ts,
    c.failed_counted || ' failed transfers counted by the ' || c.failed_source || ' metrics, '
        || coalesce(n.failed_named, 0) || ' named by trace or log lines' AS message,
    CAST(json_object('source', c.failed_source, 'counted', c.failed_counted,
        'named', coalesce(n.failed_named, 0)) AS VARCHAR) AS evidence
FROM _counted_events c LEFT JOIN n USING (engine_id)
WHERE c.failed_counted > coalesce(n.failed_named, 0)
UNION ALL
SELECT
    'kv_expired', 'error', c.engine_id, CAST(NULL AS INTEGER), CAST(NULL AS VARCHAR), CAST(NULL AS VARCHAR),
    c.start_ts, c.end_ts,
    c.expired_counted || ' requests expired by the ' || c.expired_source || ' metrics, '
        || coalesce(n.expired_named, 0) || ' named by trace or log lines',
    CAST(json_object('source', c.expired_source, 'counted', c.expired_counted,
        'named', coalesce(n.expired_named, 0)) AS VARCHAR)
FROM _counted_events c LEFT JOIN n USING (engine_id)
WHERE c.expired_counted > coalesce(n.expired_named, 0);
