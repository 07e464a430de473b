-- findings_requests: request-scoped finding rules over the connector trace and the logs.
-- include: _macros, accounting, handoffs, link_fit
--
-- Every finding view has the same ten columns, those of `analyze --format json`
-- (hybridtrace.analyze.rules.FINDING_COLUMNS; docs/views.md lists them).
-- Thresholds come from _thresholds (defaults in hybridtrace.analyze.thresholds, overridable
-- in hybridtrace.toml) through the _t() macro of _macros.sql.

-- finding_padding_leak: a read moved more than a correct connector would, and the excess
-- is allocator padding: the real layers' state as padded pages, or that plus the pages of
-- the allocator's padding layers (the evidence's `how` says which).
CREATE OR REPLACE VIEW finding_padding_leak AS
WITH leaks AS (
    -- how the excess is padding, as a number (1: the state as padded pages; 2: and the padding
    -- layers' pages), named once per finding: a text per read costs more than the rule
    SELECT *,
           CASE WHEN abs(excess_bytes - padding_gap_bytes) <= _t('excess_min_bytes') THEN 1
                WHEN padding_layers_bytes > 0
                     AND abs(excess_bytes - padding_gap_bytes - padding_layers_bytes) <= _t('excess_min_bytes')
                THEN 2 END AS how
    FROM _excess_reads
    WHERE padding_gap_bytes > 0
)
SELECT
    'padding_leak' AS kind, 'warning' AS severity, engine_id, CAST(NULL AS INTEGER) AS rank, request_id,
    min(remote_engine_id) AS remote_engine_id,
    CAST(NULL AS DOUBLE) AS start_ts, CAST(NULL AS DOUBLE) AS end_ts,
    'recurrent ' || CASE WHEN max(how) = 2 THEN 'state and padding layers' ELSE 'state' END
        || ' crossed as padded allocator pages: ' || sum(excess_bytes) || ' bytes over '
        || count(*) || ' reads beyond what the model needs' AS message,
    CAST(json_object('reads', count(*), 'transported_bytes', _json_int(sum(transported_bytes)),
        'expected_bytes', _json_int(sum(expected_bytes)), 'reserved_bytes', _json_int(sum(reserved_bytes)),
        'excess_bytes', _json_int(sum(excess_bytes)), 'padding_gap_bytes', _json_int(sum(padding_gap_bytes)),
        'padding_layers_bytes', _json_int(sum(padding_layers_bytes)),
        -- how is never null here: one value when the least and the greatest are one
        'how', CASE WHEN min(how) <> max(how) THEN 'mixed'
                    WHEN min(how) = 1 THEN 'state sent as padded pages'
                    ELSE 'state sent as padded pages, padding layers included' END) AS VARCHAR) AS evidence
FROM leaks
WHERE how IS NOT NULL
GROUP BY engine_id, request_id;

-- finding_unsharded_state: one rank received far more recurrent state than its TP shard.
-- An excess that is the padding (padded pages, padding layers) or the read's own host
-- staging copies, counted in NIXL's bytes, is those findings' and not this one's.
CREATE OR REPLACE VIEW finding_unsharded_state AS
SELECT
    'unsharded_state' AS kind, 'warning' AS severity, engine_id, rank, request_id,
    min(remote_engine_id) AS remote_engine_id,
    CAST(NULL AS DOUBLE) AS start_ts, CAST(NULL AS DOUBLE) AS end_ts,
    'rank ' || rank || ' pulled ' || sum(state_moved_bytes) || ' bytes of state; its shard is '
        || sum(expected_state_bytes) || ' bytes' AS message,
    CAST(json_object('reads', count(*), 'state_bytes_moved', _json_int(sum(state_moved_bytes)),
        'state_shard_bytes', _json_int(sum(expected_state_bytes)), 'share', any_value(share)) AS VARCHAR) AS evidence
FROM (
    -- the state a read moved: its mamba groups' bytes when the trace breaks the read down
    -- (extra attention blocks are not state), else all beyond whole attention blocks
    SELECT *, coalesce(state_transported_bytes, transported_bytes - expected_attention_bytes) AS state_moved_bytes
    FROM _excess_reads
)
WHERE state_moved_bytes >= _t('unsharded_factor') * expected_state_bytes
  AND abs(excess_bytes - padding_gap_bytes) > _t('excess_min_bytes')
  AND abs(excess_bytes - padding_gap_bytes - padding_layers_bytes) > _t('excess_min_bytes')
  AND abs(excess_bytes - coalesce(staging_bytes, 0)) > _t('excess_min_bytes')
GROUP BY engine_id, request_id, rank;

-- _host_buffer_engines: an engine staged by any of its records (one per rank, or a log):
-- one says use_host_buffer, or one says kv_buffer_device cpu and no trace record says
-- use_host_buffer false. On a CPU platform the cache itself sits in host memory and vLLM
-- stages nothing, which only the trace's explicit false tells apart; a record that says
-- nothing keeps the device rule.
CREATE OR REPLACE VIEW _host_buffer_engines AS
SELECT engine_id FROM engines
GROUP BY engine_id
HAVING bool_or(use_host_buffer)
    OR (bool_or(kv_buffer_device = 'cpu')
        AND NOT coalesce(bool_or(source_kind = 'trace' AND use_host_buffer = false), false));

-- _beyond_reserved: the successful reads of successful requests that moved more than even
-- the padded pages explain, and say nothing of staging (those are picked up as staged
-- reads). A failed request's token counts do not say what its reads carried, so its reads
-- are not judged.
CREATE OR REPLACE VIEW _beyond_reserved AS
SELECT engine_id, request_id, remote_engine_id, staging_bytes, transported_bytes, reserved_bytes,
       padding_layers_bytes
FROM _excess_reads
-- the requests that can hold such a read, with their record's status
SEMI JOIN (SELECT engine_id, request_id FROM _excess_request_model WHERE request_status = 'ok')
    USING (engine_id, request_id)
WHERE transported_bytes > reserved_bytes + padding_layers_bytes + _t('excess_min_bytes')
  AND coalesce(state_transported_bytes, transported_bytes - expected_attention_bytes)
      < _t('unsharded_factor') * expected_state_bytes
  AND coalesce(staging_bytes, 0) = 0;

-- finding_staging_copy: a read went through a host staging buffer: it says so
-- (staging_bytes > 0), or either engine registered its KV cache in host memory
-- (kv_buffer_device cpu in the trace, or the log's host-buffer line), or it moved more
-- than even the padded pages explain: beyond every page the allocator holds for it, the
-- padding layers' included, by more than excess_min_bytes, and not as recurrent state
-- (that excess is unsharded_state's).
CREATE OR REPLACE VIEW finding_staging_copy AS
-- the staged reads: those that say so (picked from the unusual reads, which the analysis
-- holds), and every read of a host-buffer engine (a scan of its own, which finds nothing to
-- read when no engine stages)
WITH staged AS MATERIALIZED (
    SELECT engine_id, request_id, remote_engine_id, staging_bytes, transported_bytes, tp_size, remote_tp_size
    FROM _unusual_reads
    WHERE staging_bytes > 0
    UNION ALL
    SELECT t.engine_id, t.request_id, t.remote_engine_id, t.staging_bytes, t.transported_bytes, t.tp_size,
           t.remote_tp_size
    FROM transfers t
    SEMI JOIN _host_buffer_engines h ON h.engine_id = t.engine_id OR h.engine_id = t.remote_engine_id
    WHERE NOT coalesce(t.staging_bytes > 0, false)
)
SELECT
    'staging_copy' AS kind, 'warning' AS severity, t.engine_id, CAST(NULL AS INTEGER) AS rank, t.request_id,
    min(t.remote_engine_id) AS remote_engine_id,
    CAST(NULL AS DOUBLE) AS start_ts, CAST(NULL AS DOUBLE) AS end_ts,
    CASE WHEN sum(t.staging_bytes) > 0
         THEN sum(t.staging_bytes) || ' bytes staged through host memory beside the network read'
         WHEN any_value(t.host_engines) IS NOT NULL
         THEN 'the KV cache of ' || array_to_string(any_value(t.host_engines), ', ')
              || ' sits in host memory: every read is copied device<->host beside the network read'
         ELSE (sum(t.transported_bytes) - sum(t.reserved_bytes) - sum(t.padding_layers_bytes))
              || ' bytes crossed beyond every page the allocator holds for the request: the transport '
              || 'counted more than KV (copies through a staging path)' END
        AS message,
    CAST(json_object('reads', count(*), 'staging_bytes', _json_int(sum(t.staging_bytes)),
        'transported_bytes', _json_int(sum(t.transported_bytes)), 'reserved_bytes', _json_int(sum(t.reserved_bytes)),
        'host_buffer_engines', coalesce(any_value(t.host_engines), []),
        'padding_layers_bytes', _json_int(sum(t.padding_layers_bytes)),
        -- beyond every page the allocator holds for the request, padding layers' included
        'copies_counted_in_transport',
        coalesce(sum(t.transported_bytes) > sum(t.reserved_bytes) + sum(t.padding_layers_bytes), false)) AS VARCHAR)
        AS evidence
FROM (
    -- the staged reads, sized here (the reserved bytes as transfer_bytes has them)
    SELECT t.engine_id, t.request_id, t.remote_engine_id, t.staging_bytes, t.transported_bytes,
           -- the pair's engines that stage through host memory, by name
           CASE WHEN h.engine_id IS NOT NULL OR r.engine_id IS NOT NULL
                THEN list_sort(list_distinct(list_filter([h.engine_id, r.engine_id], lambda x: x IS NOT NULL))) END
               AS host_engines,
           _expected_attention_bytes(q.b, q.block, q.tokens, _share(t.tp_size, t.remote_tp_size))
           + _reserved_state_bytes(q.padded_state, q.s, q.state_blocks, _share(t.tp_size, t.remote_tp_size))
               AS reserved_bytes,
           coalesce(q.padding_layer_state, 0) * q.state_blocks // _share(t.tp_size, t.remote_tp_size)
               AS padding_layers_bytes
    FROM staged t
    -- a host-buffer engine on either side (a join to the few such engines, not to every pair)
    LEFT JOIN _host_buffer_engines h ON h.engine_id = t.engine_id
    LEFT JOIN _host_buffer_engines r ON r.engine_id = t.remote_engine_id
    -- the byte model of the staged requests, picked from the sized requests first, so that
    -- the join is built on the few staged requests, not on every request: those with a read
    -- that staged bytes by a filter, the others of a host-buffer engine by a join to its reads
    LEFT JOIN (
        SELECT * FROM _sized_requests WHERE max_staging_bytes > 0
        UNION ALL
        SELECT * FROM _sized_requests
        SEMI JOIN (SELECT engine_id, request_id FROM staged WHERE NOT coalesce(staging_bytes > 0, false))
            USING (engine_id, request_id)
        WHERE NOT coalesce(max_staging_bytes > 0, false)
    ) q
        ON q.engine_id = t.engine_id AND q.request_id = t.request_id
    UNION ALL BY NAME
    -- the reads beyond every reserved page, sized once already (_excess_reads)
    SELECT * FROM _beyond_reserved
    WHERE NOT (coalesce(engine_id IN (SELECT engine_id FROM _host_buffer_engines), false)
               OR coalesce(remote_engine_id IN (SELECT engine_id FROM _host_buffer_engines), false))
) t
GROUP BY t.engine_id, t.request_id;

-- finding_useless_boundary: KV arrived that the decoder could not resume from — attention
-- beyond the usable boundary, or a recurrent-state snapshot beyond the attention that
-- arrived (boundary_tokens is a prefix length: the cached tokens count in it).
CREATE OR REPLACE VIEW finding_useless_boundary AS
SELECT
    'useless_boundary' AS kind, 'warning' AS severity, engine_id, CAST(NULL AS INTEGER) AS rank, request_id,
    remote_engine_id, CAST(NULL AS DOUBLE) AS start_ts, CAST(NULL AS DOUBLE) AS end_ts,
    CASE WHEN reused_tokens < transferred_tokens
         THEN (transferred_tokens - reused_tokens) || ' transferred tokens lay beyond the usable boundary'
              || CASE WHEN recomputed_tokens > 0 THEN ' and were recomputed' ELSE ' and went unused' END
         ELSE 'the recurrent state arrived for token ' || boundary_tokens || ' but attention only up to token '
              || (cached_tokens + transferred_tokens) || ': the decoder could not resume from it' END AS message,
    CAST(json_object('transferred_tokens', transferred_tokens, 'reused_tokens', reused_tokens,
        'recomputed_tokens', recomputed_tokens, 'boundary_tokens', boundary_tokens,
        'cached_tokens', cached_tokens) AS VARCHAR) AS evidence
FROM _request_record_rows
WHERE reused_tokens < transferred_tokens
   -- state without matching attention (only when the record says what the decoder held)
   OR (boundary_tokens > cached_tokens + transferred_tokens AND coalesce(state_blocks, 1) > 0);

-- finding_descriptor_bound: posting descriptors, not moving bytes, took most of the reads' time.
CREATE OR REPLACE VIEW finding_descriptor_bound AS
SELECT
    'descriptor_bound' AS kind, 'warning' AS severity, engine_id, CAST(NULL AS INTEGER) AS rank, request_id,
    remote_engine_id,
    CAST(NULL AS DOUBLE) AS start_ts, CAST(NULL AS DOUBLE) AS end_ts,
    'posting ' || descriptors || ' descriptors took ' || round(100 * post_s / xfer_s, 1)
        || '% of the transfer time' AS message,
    CAST(json_object('reads', timed_reads, 'descriptors', _json_int(descriptors), 'post_s', post_s,
        'xfer_s', xfer_s, 'bytes_per_descriptor', timed_bytes / nullif(descriptors, 0)) AS VARCHAR) AS evidence
FROM _request_reads
WHERE timed_reads > 0 AND post_s / xfer_s >= _t('descriptor_post_share');

-- finding_transfer_failed: a read failed (trace), the request record says its transfer
-- failed and no failed read says which rank, or a failure line named the request (logs).
CREATE OR REPLACE VIEW finding_transfer_failed AS
SELECT
    'transfer_failed' AS kind, 'error' AS severity, engine_id, rank, request_id, remote_engine_id,
    CAST(NULL AS DOUBLE) AS start_ts, CAST(NULL AS DOUBLE) AS end_ts,
    'NIXL read failed on rank ' || coalesce(CAST(rank AS VARCHAR), '?') || '; the request fell back or failed'
        AS message,
    CAST(json_object('source', any_value(source), 'reads', count(*)) AS VARCHAR) AS evidence
FROM (
    SELECT engine_id, rank, request_id, remote_engine_id, 'trace' AS source
    FROM _unsuccessful_reads WHERE status = 'failed'
    UNION ALL
    -- each side filtered before its anti join: a correlated NOT EXISTS costs twice as much
    SELECT engine_id, CAST(NULL AS INTEGER), request_id, remote_engine_id, 'trace' AS source
    FROM (SELECT engine_id, request_id, remote_engine_id FROM _unsuccessful_requests WHERE status = 'failed')
    ANTI JOIN (SELECT engine_id, request_id FROM _unsuccessful_reads WHERE status = 'failed') USING (engine_id, request_id)
    -- a failure line naming the request says which rank: that one finding is the failure
    ANTI JOIN (SELECT engine_id, request_id FROM log_events WHERE kind = 'transfer_failed')
        USING (engine_id, request_id)
    UNION ALL
    SELECT e.engine_id, e.rank, e.request_id, e.remote_engine_id, 'log' AS source
    FROM (SELECT engine_id, rank, request_id, remote_engine_id FROM log_events
          WHERE kind = 'transfer_failed' AND request_id IS NOT NULL) e
    ANTI JOIN (SELECT request_id FROM _unsuccessful_reads WHERE status = 'failed') USING (request_id)
)
GROUP BY engine_id, rank, request_id, remote_engine_id;

-- finding_kv_expired: the prefill engine released the blocks before the decoder read them.
-- Expiry lines, and the trace's `release` records (log_events of process 'trace'), come
-- from the prefill side with its request id; the decode request's remote_request_id maps
-- it to the decode request.
CREATE OR REPLACE VIEW finding_kv_expired AS
SELECT
    'kv_expired' AS kind, 'error' AS severity, engine_id, CAST(NULL AS INTEGER) AS rank, request_id,
    min(remote_engine_id) AS remote_engine_id,
    CAST(NULL AS DOUBLE) AS start_ts, CAST(NULL AS DOUBLE) AS end_ts,
    'KV blocks expired on the prefill engine before the decoder read them' AS message,
    CAST(json_object('sources', list(DISTINCT source ORDER BY source)) AS VARCHAR) AS evidence
FROM (
    SELECT engine_id, request_id, remote_engine_id, 'trace' AS source
    FROM _unsuccessful_requests WHERE status = 'expired'
    UNION ALL
    SELECT engine_id, request_id, remote_engine_id, 'trace' AS source
    FROM _unsuccessful_reads WHERE status = 'expired'
    UNION ALL
    SELECT coalesce(r.engine_id, e.engine_id), coalesce(r.request_id, e.request_id),
           coalesce(r.remote_engine_id, e.engine_id),
           CASE WHEN e.process = 'trace' THEN 'trace' ELSE 'log' END AS source
    FROM log_events e
    -- the requests the lines can name, picked before the join: a join to every request costs
    -- more than the rule
    LEFT JOIN (
        SELECT engine_id, request_id, remote_engine_id, remote_request_id FROM _request_record_rows
        WHERE remote_request_id IN (
            SELECT request_id FROM log_events WHERE kind IN ('kv_expired', 'kv_expired_declined'))
    ) r ON r.remote_request_id = e.request_id
    WHERE e.kind IN ('kv_expired', 'kv_expired_declined')
    -- prefill ids are unique per prefill engine only: when a request read from the engine
    -- that logged the line matches, requests from other prefill engines with that id do not
    QUALIFY r.remote_engine_id IS NOT DISTINCT FROM e.engine_id
         OR NOT coalesce(bool_or(r.remote_engine_id = e.engine_id)
                         OVER (PARTITION BY e.source_id, e.line_number, e.request_id), false)
)
GROUP BY engine_id, request_id;

-- _untimed_handoffs: the successful handoffs with no timed read, as the fitted link judges
-- them: what _fitted_handoffs reads of each request (the incremental analysis keeps these
-- rows per request, and applies the current fits to them every run).
--
-- @column engine_id            decode engine
-- @column request_id           decode-side request id
-- @column remote_engine_id     prefill engine
-- @column missing_tokens       prompt tokens the decoder did not hold
-- @column measured_prefill_s   the prefill time the request record measured, if any
-- @column read_bytes           one read's expected bytes (attention blocks, state blocks, at the TP share)
CREATE OR REPLACE VIEW _untimed_handoffs AS
WITH untimed AS (
    -- no successful timed read: none at all, or none with a critical path
    SELECT q.*, _share(q.model_tp_size, coalesce(p.tp_size, q.model_tp_size)) AS untimed_share
    FROM _modelled('_request_rows') q
    LEFT JOIN engine_models p ON p.engine_id = q.remote_engine_id AND p.error IS NULL
    WHERE coalesce(q.status, 'ok') = 'ok' AND q.critical_path_s IS NULL
)
SELECT engine_id, request_id, remote_engine_id, missing_tokens, prefill_s AS measured_prefill_s,
       _expected_attention_bytes(b, block, coalesce(tokens, missing_tokens), untimed_share)
       + s * state_blocks // untimed_share AS read_bytes
FROM untimed;

-- _fitted_handoffs: the handoffs with no measured transfer time (a request record of a
-- successful request, and no successful timed read of it: the reads are not in the trace),
-- their critical path predicted by the fitted link. One read's bytes as the byte model sizes
-- them (attention as whole blocks of the transferred tokens, else of the missing ones, plus
-- the state blocks, at the share the engines' TP sizes give), through the narrowest fits
-- there are: the decode ranks' fits of the pair (or of the engine's own NIXL rings, which
-- name no peer), the slowest of them, since the critical path is the slowest rank's read;
-- else the pair's (the engine's) fit over all ranks; else the fleet's. Descriptors at the
-- fitted reads' bytes per descriptor. R as handoffs computes it.
--
-- Columns:
--   engine_id, request_id, remote_engine_id, missing_tokens   the request
--   prefill_s, prefill_source                                 R, as in handoffs
--   read_bytes                                                one read's expected bytes
--   critical_path_s                                           the fitted time of that read
--   fit_scope, fit_rank, fit_source, fit_transfers_used       the fit used: its scope ('rank', 'pair',
--                                                             'fleet'), rank, source and reads
CREATE OR REPLACE VIEW _fitted_handoffs AS
WITH sized AS (SELECT * FROM _untimed_handoffs),
candidates AS (
    SELECT s.*, f.scope AS fit_scope, f.rank AS fit_rank, f.source AS fit_source,
           f.transfers_used AS fit_transfers_used,
           f.fixed_s + coalesce(s.read_bytes / f.bandwidth_bytes_per_s, 0)
           + coalesce(s.read_bytes / f.bytes_per_descriptor * f.per_descriptor_s, 0) AS critical_path_s,
           -- narrowest first: the pair's rank fits, the rings' rank fits, the pair's, the engine's, the fleet's
           CASE WHEN f.scope = 'fleet' THEN 4
                ELSE (CASE f.scope WHEN 'rank' THEN 0 ELSE 2 END)
                     + (CASE WHEN f.remote_engine_id IS NULL THEN 1 ELSE 0 END) END AS preference
    FROM sized s
    JOIN link_fits f
      ON (f.scope IN ('rank', 'pair') AND f.engine_id = s.engine_id
          AND (f.remote_engine_id = s.remote_engine_id OR f.remote_engine_id IS NULL))
      OR f.scope = 'fleet'
),
fitted AS (
    SELECT * FROM candidates
    QUALIFY row_number() OVER (PARTITION BY engine_id, request_id
                               ORDER BY preference, critical_path_s DESC, fit_rank) = 1
)
SELECT f.engine_id, f.request_id, f.remote_engine_id, f.missing_tokens,
       coalesce(f.measured_prefill_s, f.missing_tokens / nullif(_t('prefill_tokens_per_s'), 0),
                f.missing_tokens / p.tokens_per_s) AS prefill_s,
       CASE WHEN f.measured_prefill_s IS NOT NULL THEN 'measured'
            WHEN _t('prefill_tokens_per_s') > 0 THEN 'configured'
            WHEN p.tokens_per_s IS NOT NULL THEN 'estimated' END AS prefill_source,
       f.read_bytes, f.critical_path_s, f.fit_scope, f.fit_rank, f.fit_source, f.fit_transfers_used
FROM fitted f
LEFT JOIN _peak_prefill_rate p ON p.engine_id = f.engine_id;

-- _recompute_cheaper_fitted: finding_recompute_cheaper's handoffs judged by the fitted link
-- (_fitted_handoffs), a view of its own: the fits change with every read, so the
-- incremental analysis applies them anew each run instead of keeping these findings.
CREATE OR REPLACE VIEW _recompute_cheaper_fitted AS
SELECT
    'recompute_cheaper' AS kind, 'warning' AS severity, engine_id, CAST(NULL AS INTEGER) AS rank, request_id,
    remote_engine_id, CAST(NULL AS DOUBLE) AS start_ts, CAST(NULL AS DOUBLE) AS end_ts,
    'the transfer would take ' || round(critical_path_s * 1e3, 2) || ' ms by the link fitted from '
        || fit_transfers_used || ' reads; prefilling ' || missing_tokens || ' tokens here takes '
        || round(prefill_s * 1e3, 2) || ' ms (' || prefill_source || ')' AS message,
    CAST(json_object('critical_path_s', critical_path_s, 'prefill_s', prefill_s, 'prefill', prefill_source,
        'missing_tokens', missing_tokens, 'read_bytes', read_bytes, 'handoff_time_source', 'fit',
        'fit_scope', fit_scope, 'fit_rank', fit_rank, 'fit_source', fit_source,
        'fit_transfers_used', fit_transfers_used) AS VARCHAR) AS evidence
FROM _fitted_handoffs
WHERE prefill_s IS NOT NULL AND critical_path_s > prefill_s * _t('recompute_margin');

-- finding_recompute_cheaper: the handoff's critical path (its slowest read, post to
-- completion) took longer than prefilling the same missing prefix on the decoder: measured
-- when the trace has prefill_s, else configured or estimated (the evidence says which).
-- A handoff with no measured transfer time is judged by the fitted link's prediction
-- (_fitted_handoffs); the evidence's handoff_time_source says which ('measured' or 'fit').
CREATE OR REPLACE VIEW finding_recompute_cheaper AS
SELECT
    'recompute_cheaper' AS kind, 'warning' AS severity, engine_id, CAST(NULL AS INTEGER) AS rank, request_id,
    remote_engine_id, CAST(NULL AS DOUBLE) AS start_ts, CAST(NULL AS DOUBLE) AS end_ts,
    'the transfer took ' || round(critical_path_s * 1e3, 2) || ' ms; prefilling ' || missing_tokens
        || ' tokens here takes ' || round(prefill_s * 1e3, 2) || ' ms (' || prefill_source || ')' AS message,
    CAST(json_object('critical_path_s', critical_path_s, 'prefill_s', prefill_s, 'prefill', prefill_source,
        'missing_tokens', missing_tokens, 'slowest_rank', slowest_rank,
        'handoff_time_source', 'measured') AS VARCHAR) AS evidence
FROM handoffs
WHERE coalesce(status, 'ok') = 'ok' AND prefill_s IS NOT NULL
  AND critical_path_s > prefill_s * _t('recompute_margin')
UNION ALL
SELECT * FROM _recompute_cheaper_fitted;
