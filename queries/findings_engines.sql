-- findings_engines: rank- and engine-pair-scoped finding rules (columns as in findings_requests).

-- _rank_windows: each decode rank's median effective bandwidth per time window, beside the
-- median of its peers (the other ranks of the same engine in the same window). All ranks
-- of an engine poll alike, so polling delay does not favour one of them.
--
-- Columns:
--   engine_id, rank, window   the rank and the window (floor(ts / window_s))
--   reads                     successful reads of the rank in the window
--   median_gb_s               median of the rank's per-read bytes / xfer_s, decimal GB/s
--   peer_median_gb_s          median of the other ranks' medians; null with no peer
CREATE OR REPLACE VIEW _rank_windows AS
WITH per_rank AS (
    SELECT engine_id, rank, floor(ts / _t('window_s')) AS window, count(*) AS reads,
           median(transported_bytes / xfer_s) / 1e9 AS median_gb_s
    FROM transfers
    WHERE status = 'ok' AND xfer_s > 0
    GROUP BY ALL
    HAVING count(*) >= _t('slow_rank_min_reads')
)
SELECT a.*, (SELECT median(b.median_gb_s) FROM per_rank b
             WHERE b.engine_id = a.engine_id AND b.window = a.window AND b.rank <> a.rank) AS peer_median_gb_s
FROM per_rank a;

-- finding_slow_rank: a rank slower than its peers in most windows, and how often it set the
-- handoff's critical path (was the slowest read of a request).
CREATE OR REPLACE VIEW finding_slow_rank AS
WITH judged AS (
    SELECT engine_id, rank,
           count(*) FILTER (WHERE peer_median_gb_s IS NOT NULL) AS windows,
           count(*) FILTER (WHERE median_gb_s < _t('slow_rank_ratio') * peer_median_gb_s) AS slow_windows,
           median(median_gb_s) AS median_gb_s,
           median(peer_median_gb_s) AS peer_median_gb_s
    FROM _rank_windows GROUP BY ALL
),
critical AS (
    SELECT engine_id, rank, count(*) AS requests_led
    FROM (SELECT engine_id, request_id, arg_max(rank, xfer_s) AS rank FROM transfers WHERE status = 'ok' GROUP BY ALL)
    GROUP BY ALL
),
requests_per_engine AS (
    SELECT engine_id, count(DISTINCT request_id) AS requests FROM transfers WHERE status = 'ok' GROUP BY ALL
)
SELECT
    'slow_rank' AS kind, 'warning' AS severity, j.engine_id, j.rank, CAST(NULL AS VARCHAR) AS request_id,
    CAST(NULL AS VARCHAR) AS remote_engine_id, CAST(NULL AS DOUBLE) AS start_ts, CAST(NULL AS DOUBLE) AS end_ts,
    'rank ' || j.rank || ' reads at ' || round(j.median_gb_s, 2) || ' GB/s against ' || round(j.peer_median_gb_s, 2)
        || ' GB/s for its peers, and set the critical path of '
        || round(100 * coalesce(c.requests_led, 0) / q.requests, 1) || '% of requests' AS message,
    CAST(json_object('median_gb_s', j.median_gb_s, 'peer_median_gb_s', j.peer_median_gb_s,
        'slow_windows', j.slow_windows, 'windows', j.windows,
        'critical_path_share', coalesce(c.requests_led, 0) / q.requests) AS VARCHAR) AS evidence
FROM judged j
LEFT JOIN critical c USING (engine_id, rank)
JOIN requests_per_engine q USING (engine_id)
WHERE j.windows > 0 AND j.slow_windows >= _t('slow_rank_windows') * j.windows;

-- finding_config_mismatch: a prefill/decode pair that exchanges KV disagrees on the KV
-- cache dtype, or a handshake failed on a compatibility hash.
CREATE OR REPLACE VIEW finding_config_mismatch AS
WITH pairs AS (SELECT DISTINCT engine_id, remote_engine_id FROM transfers),
settings AS (
    SELECT engine_id, any_value(kv_cache_dtype) AS kv_cache_dtype, any_value(kv_layout) AS kv_layout,
           max(block_tokens) AS block_tokens
    FROM engines GROUP BY ALL
),
handshakes AS (
    SELECT engine_id, count(*) AS mismatches, any_value(details) AS details
    FROM log_events WHERE kind = 'handshake_mismatch' GROUP BY ALL
)
SELECT
    'config_mismatch' AS kind, 'error' AS severity, p.engine_id, CAST(NULL AS INTEGER) AS rank,
    CAST(NULL AS VARCHAR) AS request_id, p.remote_engine_id, CAST(NULL AS DOUBLE) AS start_ts,
    CAST(NULL AS DOUBLE) AS end_ts,
    'decode ' || p.engine_id || ' and prefill ' || p.remote_engine_id || ' disagree: '
        || concat_ws('; ',
            CASE WHEN d.kv_cache_dtype IS DISTINCT FROM r.kv_cache_dtype
                 THEN 'KV dtype ' || coalesce(d.kv_cache_dtype, '?') || ' vs ' || coalesce(r.kv_cache_dtype, '?') END,
            CASE WHEN d.kv_layout IS DISTINCT FROM r.kv_layout AND d.kv_layout IS NOT NULL AND r.kv_layout IS NOT NULL
                 THEN 'KV layout ' || d.kv_layout || ' vs ' || r.kv_layout END,
            CASE WHEN h.mismatches > 0 THEN 'handshake compatibility hash mismatch' END) AS message,
    CAST(json_object('decode_kv_cache_dtype', d.kv_cache_dtype, 'prefill_kv_cache_dtype', r.kv_cache_dtype,
        'decode_kv_layout', d.kv_layout, 'prefill_kv_layout', r.kv_layout,
        'handshake_mismatches', coalesce(h.mismatches, 0)) AS VARCHAR) AS evidence
FROM pairs p
LEFT JOIN settings d ON d.engine_id = p.engine_id
LEFT JOIN settings r ON r.engine_id = p.remote_engine_id
LEFT JOIN handshakes h ON h.engine_id = p.engine_id
WHERE (d.kv_cache_dtype IS NOT NULL AND r.kv_cache_dtype IS NOT NULL AND d.kv_cache_dtype <> r.kv_cache_dtype)
   OR (d.kv_layout IS NOT NULL AND r.kv_layout IS NOT NULL AND d.kv_layout <> r.kv_layout)
   OR h.mismatches > 0;
