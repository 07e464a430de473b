-- findings_engines: rank- and engine-pair-scoped finding rules (columns as in findings_requests).
-- include: _macros, handoffs, link_fit

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

-- _rank_fit_verdicts: per decode rank, its fitted bandwidth against its peers' median
-- (rank_link_fits) on the pair and route where it stands lowest, and whether that is below
-- slow_rank_fit_ratio of the peers': the fit agrees that the rank is slow.
CREATE OR REPLACE VIEW _rank_fit_verdicts AS
SELECT engine_id, rank,
       arg_min(bandwidth_bytes_per_s, bandwidth_ratio) AS fit_bandwidth_bytes_per_s,
       arg_min(peer_bandwidth_bytes_per_s, bandwidth_ratio) AS fit_peer_bandwidth_bytes_per_s,
       arg_min(transfers_used, bandwidth_ratio) AS fit_transfers_used,
       min(bandwidth_ratio) < _t('slow_rank_fit_ratio') AS fit_agrees
FROM rank_link_fits
WHERE bandwidth_ratio IS NOT NULL
GROUP BY ALL;

-- _critical_path_leads: per decode rank, the requests whose slowest read it made (a view of
-- its own: the incremental analysis reads these counts from its state, not from every read).
CREATE OR REPLACE VIEW _critical_path_leads AS
SELECT engine_id, slowest_rank AS rank, count(*) AS requests_led
FROM _request_reads WHERE slowest_rank IS NOT NULL
GROUP BY ALL;

-- _critical_path_requests: per decode engine, the requests with a critical path.
CREATE OR REPLACE VIEW _critical_path_requests AS
SELECT engine_id, count(*) AS requests FROM _request_reads WHERE critical_path_s IS NOT NULL GROUP BY ALL;

-- finding_slow_rank: a rank slower than its peers in most windows, and how often it set the
-- handoff's critical path (was the slowest read of a request). The evidence says whether
-- the fitted link agrees (fit_agrees: its fitted bandwidth is below slow_rank_fit_ratio of
-- its peers' median; null when the rank or its peers have no fit).
CREATE OR REPLACE VIEW finding_slow_rank AS
WITH judged AS (
    SELECT engine_id, rank,
           count(*) FILTER (WHERE peer_median_gb_s IS NOT NULL) AS windows,
           count(*) FILTER (WHERE median_gb_s < _t('slow_rank_ratio') * peer_median_gb_s) AS slow_windows,
           median(median_gb_s) AS median_gb_s,
           median(peer_median_gb_s) AS peer_median_gb_s
    FROM _rank_windows GROUP BY ALL
),
critical AS (SELECT * FROM _critical_path_leads),
requests_per_engine AS (SELECT * FROM _critical_path_requests)
SELECT
    'slow_rank' AS kind, 'warning' AS severity, j.engine_id, j.rank, CAST(NULL AS VARCHAR) AS request_id,
    CAST(NULL AS VARCHAR) AS remote_engine_id, CAST(NULL AS DOUBLE) AS start_ts, CAST(NULL AS DOUBLE) AS end_ts,
    'rank ' || j.rank || ' reads at ' || round(j.median_gb_s, 2) || ' GB/s against ' || round(j.peer_median_gb_s, 2)
        || ' GB/s for its peers, and set the critical path of '
        || round(100 * coalesce(c.requests_led, 0) / q.requests, 1) || '% of requests' AS message,
    CAST(json_object('median_gb_s', j.median_gb_s, 'peer_median_gb_s', j.peer_median_gb_s,
        'slow_windows', j.slow_windows, 'windows', j.windows,
        'critical_path_share', coalesce(c.requests_led, 0) / q.requests,
        'fit_agrees', f.fit_agrees, 'fit_bandwidth_bytes_per_s', f.fit_bandwidth_bytes_per_s,
        'fit_peer_bandwidth_bytes_per_s', f.fit_peer_bandwidth_bytes_per_s,
        'fit_transfers_used', f.fit_transfers_used) AS VARCHAR) AS evidence
FROM judged j
LEFT JOIN critical c USING (engine_id, rank)
JOIN requests_per_engine q USING (engine_id)
LEFT JOIN _rank_fit_verdicts f USING (engine_id, rank)
WHERE j.windows > 0 AND j.slow_windows >= _t('slow_rank_windows') * j.windows;

-- _engine_settings: each engine's settings as finding_config_mismatch compares them.
--
-- Settings come from the engines' own records (trace `engine` records, log lines) and,
-- for dtypes, from the byte model that resolves `auto` the way vLLM does, so `auto`
-- against the dtype it stands for is no mismatch. A setting one side does not report is
-- not compared. Compared: KV cache dtype, KV layout, attention block size, Mamba conv and
-- SSM state dtypes, Mamba cache mode, hybrid-allocator use, and the TP shape (one TP size must
-- divide the other for ranks to pair).
CREATE OR REPLACE VIEW _engine_settings AS
WITH e AS (
    -- each setting as the engine's newest record says it (_engine_newest, store/engine_settings.py)
    SELECT engine_id, kv_cache_dtype, kv_layout, block_tokens, mamba_cache_dtype AS conv_dtype,
           mamba_ssm_cache_dtype AS ssm_dtype, mamba_cache_mode, hybrid_allocator, tp_size
    FROM _engine_newest
)
SELECT e.engine_id,
       coalesce(m.kv_cache_dtype, nullif(e.kv_cache_dtype, 'auto')) AS kv_cache_dtype,
       e.kv_layout,
       coalesce(e.block_tokens, m.block_tokens) AS block_tokens,
       coalesce(m.mamba_cache_dtype, nullif(e.conv_dtype, 'auto')) AS mamba_cache_dtype,
       coalesce(m.mamba_ssm_cache_dtype, nullif(e.ssm_dtype, 'auto')) AS mamba_ssm_cache_dtype,
       e.mamba_cache_mode, e.hybrid_allocator,
       coalesce(e.tp_size, m.tp_size) AS tp_size
FROM e LEFT JOIN engine_models m ON m.engine_id = e.engine_id AND m.error IS NULL;

-- _handshake_mismatches: failed handshakes per logging engine (and the remote it names).
CREATE OR REPLACE VIEW _handshake_mismatches AS
SELECT engine_id, remote_engine_id, count(*) AS mismatches
FROM log_events WHERE kind = 'handshake_mismatch' GROUP BY ALL;

-- _read_engine_pairs: the (decode, prefill) engine pairs the reads name, each once;
-- remote_engine_id null for reads that name no prefill engine. An incremental analysis reads
-- them from its counters instead of every read.
CREATE OR REPLACE VIEW _read_engine_pairs AS
SELECT DISTINCT engine_id, remote_engine_id FROM transfers;

-- _record_engine_pairs: the (decode, prefill) engine pairs the request records name, each
-- once (records naming no prefill engine left out). An incremental analysis reads them from
-- its counters instead of every record.
CREATE OR REPLACE VIEW _record_engine_pairs AS
SELECT DISTINCT engine_id, remote_engine_id FROM requests WHERE remote_engine_id IS NOT NULL;

-- _config_pairs: the decode/prefill pairs whose settings are compared. Engines that
-- exchanged KV or tried to: reads, request records (a failed handshake leaves no read),
-- failure lines naming both engines; and a handshake mismatch no such pair explains, as a
-- pair of its own (remote_engine_id null when the line names none), so it is never lost.
CREATE OR REPLACE VIEW _config_pairs AS
WITH known AS (
    SELECT engine_id, remote_engine_id FROM _read_engine_pairs
    UNION
    SELECT engine_id, remote_engine_id FROM _record_engine_pairs
    UNION
    SELECT DISTINCT engine_id, remote_engine_id FROM log_events
    WHERE kind IN ('transfer_failed', 'handshake_mismatch') AND remote_engine_id IS NOT NULL
)
SELECT engine_id, remote_engine_id FROM known
UNION
SELECT h.engine_id, h.remote_engine_id FROM _handshake_mismatches h
WHERE NOT EXISTS (
    SELECT 1 FROM known k
    WHERE (k.engine_id = h.engine_id AND (h.remote_engine_id IS NULL OR k.remote_engine_id = h.remote_engine_id))
       OR (k.remote_engine_id = h.engine_id AND k.engine_id = h.remote_engine_id));

-- finding_config_mismatch: a prefill/decode pair that exchanges KV disagrees on what a
-- direct transfer needs (settings as _engine_settings resolves them), or a handshake
-- failed on a compatibility hash.
CREATE OR REPLACE VIEW finding_config_mismatch AS
WITH pairs AS (SELECT * FROM _config_pairs),
-- a mismatch belongs to a pair when the decode engine logged it (naming that prefill
-- engine, or none), or the prefill engine logged it naming that decode engine
paired_handshakes AS (
    SELECT p.engine_id, p.remote_engine_id, sum(h.mismatches) AS mismatches
    FROM pairs p JOIN _handshake_mismatches h
      ON (h.engine_id = p.engine_id AND (h.remote_engine_id IS NULL OR p.remote_engine_id IS NULL
                                         OR h.remote_engine_id = p.remote_engine_id))
      OR (h.engine_id = p.remote_engine_id AND h.remote_engine_id = p.engine_id)
    GROUP BY ALL
),
compared AS (
    SELECT p.engine_id, p.remote_engine_id, d AS dec, r AS pre, coalesce(h.mismatches, 0) AS mismatches,
           list_filter([
               CASE WHEN d.kv_cache_dtype <> r.kv_cache_dtype
                    THEN 'KV dtype ' || d.kv_cache_dtype || ' vs ' || r.kv_cache_dtype END,
               CASE WHEN d.kv_layout <> r.kv_layout THEN 'KV layout ' || d.kv_layout || ' vs ' || r.kv_layout END,
               CASE WHEN d.block_tokens <> r.block_tokens
                    THEN 'block size ' || d.block_tokens || ' vs ' || r.block_tokens || ' tokens' END,
               CASE WHEN d.mamba_cache_dtype <> r.mamba_cache_dtype
                    THEN 'conv state dtype ' || d.mamba_cache_dtype || ' vs ' || r.mamba_cache_dtype END,
               CASE WHEN d.mamba_ssm_cache_dtype <> r.mamba_ssm_cache_dtype
                    THEN 'SSM state dtype ' || d.mamba_ssm_cache_dtype || ' vs ' || r.mamba_ssm_cache_dtype END,
               CASE WHEN d.mamba_cache_mode <> r.mamba_cache_mode
                    THEN 'Mamba cache mode ' || d.mamba_cache_mode || ' vs ' || r.mamba_cache_mode END,
               CASE WHEN d.hybrid_allocator <> r.hybrid_allocator
                    THEN 'hybrid allocator ' || CASE WHEN d.hybrid_allocator THEN 'on' ELSE 'off' END || ' vs '
                         || CASE WHEN r.hybrid_allocator THEN 'on' ELSE 'off' END END,
               CASE WHEN d.tp_size % r.tp_size <> 0 AND r.tp_size % d.tp_size <> 0
                    THEN 'TP ' || d.tp_size || ' vs ' || r.tp_size || ' (neither divides the other)' END,
               CASE WHEN h.mismatches > 0 THEN 'handshake compatibility hash mismatch' END
           ], lambda x: x IS NOT NULL) AS differs
    FROM pairs p
    LEFT JOIN _engine_settings d ON d.engine_id = p.engine_id
    LEFT JOIN _engine_settings r ON r.engine_id = p.remote_engine_id
    LEFT JOIN paired_handshakes h
      ON h.engine_id = p.engine_id AND h.remote_engine_id IS NOT DISTINCT FROM p.remote_engine_id
)
SELECT
    'config_mismatch' AS kind, 'error' AS severity, engine_id, CAST(NULL AS INTEGER) AS rank,
    CAST(NULL AS VARCHAR) AS request_id, remote_engine_id, CAST(NULL AS DOUBLE) AS start_ts,
    CAST(NULL AS DOUBLE) AS end_ts,
    'decode ' || engine_id || ' and prefill ' || coalesce(remote_engine_id, '?') || ' disagree: '
        || array_to_string(differs, '; ') AS message,
    CAST(json_object('differs', differs,
        'decode_kv_cache_dtype', dec.kv_cache_dtype, 'prefill_kv_cache_dtype', pre.kv_cache_dtype,
        'decode_kv_layout', dec.kv_layout, 'prefill_kv_layout', pre.kv_layout,
        'decode_block_tokens', dec.block_tokens, 'prefill_block_tokens', pre.block_tokens,
        'decode_mamba_cache_dtype', dec.mamba_cache_dtype, 'prefill_mamba_cache_dtype', pre.mamba_cache_dtype,
        'decode_mamba_ssm_cache_dtype', dec.mamba_ssm_cache_dtype,
        'prefill_mamba_ssm_cache_dtype', pre.mamba_ssm_cache_dtype,
        'decode_mamba_cache_mode', dec.mamba_cache_mode, 'prefill_mamba_cache_mode', pre.mamba_cache_mode,
        'decode_tp_size', dec.tp_size, 'prefill_tp_size', pre.tp_size,
        'handshake_mismatches', mismatches) AS VARCHAR) AS evidence
FROM compared
WHERE len(differs) > 0;
