-- handoffs: each request's handoff as one row — tokens, critical path, prefill time — and
-- transfer against recompute per missing-prefix bucket.

-- _peak_prefill_rate: the highest prompt throughput a decode engine logged (tokens/s).
-- `Engine NNN:` lines average over 10 s, so they measure load, not capacity: the peak is
-- the best estimate of what the engine can prefill, and it is labelled an estimate.
CREATE OR REPLACE VIEW _peak_prefill_rate AS
SELECT engine_id,
       max(CAST(json_extract(details, '$.avg_prompt_throughput_tokens_s') AS DOUBLE)) AS tokens_per_s
FROM log_events
WHERE kind = 'engine_stats'
GROUP BY ALL
HAVING max(CAST(json_extract(details, '$.avg_prompt_throughput_tokens_s') AS DOUBLE)) > 0;

-- _request_reads: every request's reads in one pass over `transfers` (no request record
-- needed), shared by handoffs, slow_rank and descriptor_bound.
--
-- Columns:
--   engine_id, request_id, remote_engine_id     the request (the first by name of the prefill engines it read from)
--   reads, ranks                                all reads, distinct decode ranks
--   critical_path_s, slowest_rank, critical_bytes   the slowest successful read
--   aggregate_bytes                             bytes of all successful reads
--   timed_reads, timed_bytes, descriptors,      over successful reads with a transfer time:
--   post_s, xfer_s                              their count, bytes, descriptors and times
CREATE OR REPLACE VIEW _request_reads AS
SELECT engine_id, request_id,
       min(remote_engine_id) AS remote_engine_id,
       count(*) AS reads, _rank_count(rank) AS ranks,
       max(xfer_s) FILTER (WHERE status = 'ok') AS critical_path_s,
       arg_max(rank, xfer_s) FILTER (WHERE status = 'ok') AS slowest_rank,
       arg_max(transported_bytes, xfer_s) FILTER (WHERE status = 'ok') AS critical_bytes,
       sum(transported_bytes) FILTER (WHERE status = 'ok') AS aggregate_bytes,
       count(*) FILTER (WHERE status = 'ok' AND xfer_s > 0) AS timed_reads,
       sum(transported_bytes) FILTER (WHERE status = 'ok' AND xfer_s > 0) AS timed_bytes,
       sum(descriptors) FILTER (WHERE status = 'ok' AND xfer_s > 0) AS descriptors,
       sum(post_s) FILTER (WHERE status = 'ok' AND xfer_s > 0) AS post_s,
       sum(xfer_s) FILTER (WHERE status = 'ok' AND xfer_s > 0) AS xfer_s
FROM transfers
GROUP BY engine_id, request_id;

-- handoffs: one row per request with reads.
--
-- Columns:
--   engine_id, request_id, remote_engine_id, status        the request
--   missing_tokens, transferred_tokens, reused_tokens,
--   recomputed_tokens, boundary_tokens, state_blocks       tokens (the usable boundary is
--                                                          boundary_tokens; reused = what
--                                                          it saved)
--   reads, ranks                                           NIXL reads and decode ranks
--   critical_path_s     the slowest successful read, post to completion (X)
--   slowest_rank        the rank that read it
--   critical_bytes      bytes of that read
--   aggregate_bytes     bytes of all successful reads (capacity, not latency)
--   prefill_s           R: measured destination prefill time when the trace has it, else
--                       missing_tokens / the configured prefill rate (threshold
--                       prefill_tokens_per_s, when set), else / the engine's peak logged
--                       prompt throughput
--   prefill_source      'measured', 'configured', 'estimated' or null (no way to know)
--   transfer_minus_prefill_s   X − R (positive: recomputing would have been faster)
CREATE OR REPLACE VIEW handoffs AS
SELECT
    r.engine_id, r.request_id, r.remote_engine_id, r.status,
    r.missing_tokens, r.transferred_tokens, r.reused_tokens, r.recomputed_tokens, r.boundary_tokens, r.state_blocks,
    x.reads, x.ranks, x.critical_path_s, x.slowest_rank, x.critical_bytes, x.aggregate_bytes,
    coalesce(r.prefill_s, r.missing_tokens / nullif(_t('prefill_tokens_per_s'), 0), r.missing_tokens / p.tokens_per_s)
        AS prefill_s,
    CASE WHEN r.prefill_s IS NOT NULL THEN 'measured'
         WHEN _t('prefill_tokens_per_s') > 0 THEN 'configured'
         WHEN p.tokens_per_s IS NOT NULL THEN 'estimated' END AS prefill_source,
    x.critical_path_s - coalesce(r.prefill_s, r.missing_tokens / nullif(_t('prefill_tokens_per_s'), 0),
                                 r.missing_tokens / p.tokens_per_s) AS transfer_minus_prefill_s
FROM requests r
JOIN _request_reads x USING (engine_id, request_id)
LEFT JOIN _peak_prefill_rate p ON p.engine_id = r.engine_id;

-- transfer_vs_recompute: X against R per missing-prefix bucket, at the bucket's p50, p95
-- and maximum (an average would route tail requests into a saturated link).
--
-- Columns:
--   engine_id, bucket          the decode engine; bucket = power-of-four band of missing tokens
--   requests                   handoffs in the bucket with both X and R
--   missing_p50/p95/max        missing-prefix length quantiles
--   transfer_p50_s/p95_s/max_s X: critical-path quantiles
--   prefill_p50_s/p95_s/max_s  R: prefill-time quantiles
--   transfer_slower_share      share of the bucket's requests where X > R
--   prefill_source             'measured', 'estimated' or 'mixed'
CREATE OR REPLACE VIEW transfer_vs_recompute AS
SELECT
    engine_id,
    CASE WHEN missing_tokens < 256 THEN '<256'
         WHEN missing_tokens < 1024 THEN '256-1K'
         WHEN missing_tokens < 4096 THEN '1K-4K'
         WHEN missing_tokens < 16384 THEN '4K-16K'
         ELSE '>=16K' END AS bucket,
    count(*) AS requests,
    quantile_cont(missing_tokens, 0.5) AS missing_p50,
    quantile_cont(missing_tokens, 0.95) AS missing_p95,
    max(missing_tokens) AS missing_max,
    quantile_cont(critical_path_s, 0.5) AS transfer_p50_s,
    quantile_cont(critical_path_s, 0.95) AS transfer_p95_s,
    max(critical_path_s) AS transfer_max_s,
    quantile_cont(prefill_s, 0.5) AS prefill_p50_s,
    quantile_cont(prefill_s, 0.95) AS prefill_p95_s,
    max(prefill_s) AS prefill_max_s,
    avg(CASE WHEN critical_path_s > prefill_s THEN 1.0 ELSE 0.0 END) AS transfer_slower_share,
    CASE WHEN count(DISTINCT prefill_source) > 1 THEN 'mixed' ELSE any_value(prefill_source) END AS prefill_source
FROM handoffs
WHERE critical_path_s IS NOT NULL AND prefill_s IS NOT NULL
GROUP BY ALL
ORDER BY engine_id, min(missing_tokens);

-- route_bandwidth: effective bandwidth per engine pair and route, so a topology change shows.
--
-- Columns:
--   engine_id, remote_engine_id, link   decode engine, prefill engine, route
--   reads                               successful reads
--   effective_gb_s                      sum of bytes / sum of transfer time (ratio of sums), GB/s
--   post_share                          sum of post time / sum of transfer time
--   bytes_per_descriptor                sum of bytes / sum of descriptors
CREATE OR REPLACE VIEW route_bandwidth AS
SELECT
    engine_id, remote_engine_id, link,
    count(*) AS reads,
    sum(transported_bytes) / nullif(sum(xfer_s), 0) / 1e9 AS effective_gb_s,
    sum(post_s) / nullif(sum(xfer_s), 0) AS post_share,
    sum(transported_bytes) / nullif(sum(descriptors), 0) AS bytes_per_descriptor
FROM transfers
WHERE status = 'ok'
GROUP BY ALL;
