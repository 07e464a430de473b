-- handoffs: each request's handoff as one row — tokens, critical path, prefill time — and
-- transfer against recompute per missing-prefix bucket.
-- include: _macros

-- _peak_prefill_rate_of(lines): _peak_prefill_rate over the rows of `lines` (a relation named
-- as text, with the columns engine_id, kind and details of log_events): the incremental
-- analysis takes the new lines' peaks with it and keeps the others.
CREATE OR REPLACE MACRO _peak_prefill_rate_of(lines) AS TABLE
SELECT engine_id,
       max(CAST(json_extract(details, '$.avg_prompt_throughput_tokens_s') AS DOUBLE)) AS tokens_per_s
FROM query_table(lines)
WHERE kind = 'engine_stats'
GROUP BY ALL
HAVING max(CAST(json_extract(details, '$.avg_prompt_throughput_tokens_s') AS DOUBLE)) > 0;

-- _peak_prefill_rate: the highest prompt throughput a decode engine logged (tokens/s).
-- `Engine NNN:` lines average over 10 s, so they measure load, not capacity: the peak is
-- the best estimate of what the engine can prefill, and it is labelled an estimate.
CREATE OR REPLACE VIEW _peak_prefill_rate AS
SELECT * FROM _peak_prefill_rate_of('log_events');

-- _unusual_reads: the few reads the failure, expiry and staging rules read: those that failed
-- or expired, and those that staged bytes through host memory. One scan of the reads for all
-- of them (the analysis computes it once): each rule picks its own from these rows.
--
-- Columns:
--   engine_id, rank, request_id, remote_engine_id, status,
--   staging_bytes, transported_bytes, tp_size, remote_tp_size   as in transfers
CREATE OR REPLACE VIEW _unusual_reads AS
SELECT engine_id, rank, request_id, remote_engine_id, status, staging_bytes, transported_bytes, tp_size,
       remote_tp_size
FROM transfers WHERE status IN ('failed', 'expired') OR staging_bytes > 0;

-- _unsuccessful_reads: the reads that failed or expired (of _unusual_reads).
--
-- Columns:
--   engine_id, rank, request_id, remote_engine_id, status   as in transfers
CREATE OR REPLACE VIEW _unsuccessful_reads AS
SELECT engine_id, rank, request_id, remote_engine_id, status FROM _unusual_reads WHERE status IN ('failed', 'expired');

-- _unsuccessful_requests: the request records that say the transfer failed or expired.
--
-- Columns:
--   engine_id, request_id, remote_engine_id, status   as in requests
CREATE OR REPLACE VIEW _unsuccessful_requests AS
SELECT engine_id, request_id, remote_engine_id, status FROM requests WHERE status IN ('failed', 'expired');

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
--   reads_ok, max_ok_bytes                      successful reads, and the bytes of the largest
--   share, shares_agree                         reads per decode rank (accounting.sql's share) and whether
--                                               every read of the request makes the same one (_accounting_totals
--                                               then sizes the request once instead of read by read)
--   max_staging_bytes                           the most bytes one of its reads staged through host memory
CREATE OR REPLACE VIEW _request_reads AS
SELECT engine_id, request_id,
       min(remote_engine_id) AS remote_engine_id,
       count(*) AS reads, _rank_count(rank) AS ranks,
       max(ok_xfer_s) AS critical_path_s,
       arg_max(rank, ok_xfer_s) AS slowest_rank,
       arg_max(transported_bytes, ok_xfer_s) AS critical_bytes,
       sum(ok_bytes) AS aggregate_bytes,
       count(timed_status) AS timed_reads,
       sum(CASE WHEN timed THEN transported_bytes END) AS timed_bytes,
       sum(CASE WHEN timed THEN descriptors END) AS descriptors,
       sum(CASE WHEN timed THEN post_s END) AS post_s,
       sum(CASE WHEN timed THEN xfer_s END) AS xfer_s,
       count(ok_status) AS reads_ok,
       max(ok_bytes) AS max_ok_bytes,
       min(share) AS share,
       min(share) IS NOT DISTINCT FROM max(share) AND count(share) IN (0, count(*)) AS shares_agree,
       max(staging_bytes) AS max_staging_bytes
FROM (
    -- each read's successful and timed values, null where it is not: plain aggregates over
    -- these cost less than each aggregate filtering the reads again (a fifth of the pass)
    SELECT engine_id, request_id, remote_engine_id, rank, transported_bytes, descriptors, post_s, xfer_s,
           staging_bytes,
           CASE WHEN status = 'ok' THEN true END AS ok_status,
           CASE WHEN status = 'ok' THEN xfer_s END AS ok_xfer_s,
           CASE WHEN status = 'ok' THEN transported_bytes END AS ok_bytes,
           status = 'ok' AND xfer_s > 0 AS timed,
           CASE WHEN status = 'ok' AND xfer_s > 0 THEN true END AS timed_status,
           _share(tp_size, remote_tp_size) AS share
    FROM transfers
)
GROUP BY engine_id, request_id;

-- _request_rows: every request record beside its reads grouped once (_request_reads), null
-- where it has none: handoffs, the sized requests and the untimed handoffs each read these
-- rows, so that an analysis joins the records to the reads once, not once for each.
--
-- Columns:
--   engine_id, request_id, remote_engine_id,
--   status, missing_tokens, transferred_tokens,
--   reused_tokens, recomputed_tokens,
--   boundary_tokens, state_blocks, prefill_s,
--   cached_tokens, remote_request_id            as in requests (the columns the byte model, handoffs and the
--                                               request rules read: _request_record_rows)
--   has_reads                                   whether the trace holds a read of the request
--   reads, ranks, critical_path_s, slowest_rank,
--   critical_bytes, aggregate_bytes, reads_ok,
--   max_ok_bytes, share, shares_agree,
--   max_staging_bytes                           as _request_reads has them
CREATE OR REPLACE VIEW _request_rows AS
SELECT r.engine_id, r.request_id, r.remote_engine_id, r.status, r.missing_tokens, r.transferred_tokens,
       r.reused_tokens, r.recomputed_tokens, r.boundary_tokens, r.state_blocks, r.prefill_s, r.cached_tokens,
       r.remote_request_id,
       x.engine_id IS NOT NULL AS has_reads,
       x.reads, x.ranks, x.critical_path_s, x.slowest_rank, x.critical_bytes, x.aggregate_bytes, x.reads_ok,
       x.max_ok_bytes, x.share, x.shares_agree, x.max_staging_bytes
FROM requests r
LEFT JOIN _request_reads x ON x.engine_id = r.engine_id AND x.request_id = r.request_id;

-- _unsuccessful_request_rows: _unsuccessful_requests from the request rows an analysis holds
-- (_request_rows, one row per request record): the analysis computes _unsuccessful_requests
-- from these instead of scanning every record's status again.
--
-- Columns:
--   engine_id, request_id, remote_engine_id, status   as in requests
CREATE OR REPLACE VIEW _unsuccessful_request_rows AS
SELECT engine_id, request_id, remote_engine_id, status FROM _request_rows WHERE status IN ('failed', 'expired');

-- _request_record_rows: the request records' columns the request rules read. Over the store
-- a plain projection of `requests` (a look-up of one request, as `explain` makes, reads one
-- record); an analysis points it at the request rows it holds (_request_rows has these
-- columns, one row per record), so that the rules do not read the records' files again.
--
-- Columns:
--   engine_id, request_id, remote_engine_id, remote_request_id, status,
--   transferred_tokens, reused_tokens, recomputed_tokens, boundary_tokens,
--   cached_tokens, state_blocks                 as in requests
CREATE OR REPLACE VIEW _request_record_rows AS
SELECT engine_id, request_id, remote_engine_id, remote_request_id, status, transferred_tokens, reused_tokens,
       recomputed_tokens, boundary_tokens, cached_tokens, state_blocks
FROM requests;

-- handoffs: one row per request with reads.
--
-- The usable boundary is boundary_tokens; reused_tokens is what it saved. X is the critical
-- path, R the prefill time.
--
-- @column engine_id                 decode engine
-- @column request_id                decode-side request id
-- @column remote_engine_id          prefill engine
-- @column status                    the request record's status
-- @column missing_tokens            prompt tokens the decoder did not hold
-- @column transferred_tokens        tokens whose KV crossed
-- @column reused_tokens             transferred tokens the decoder resumed from
-- @column recomputed_tokens         tokens the decoder prefilled itself
-- @column boundary_tokens           prefix length the recurrent state snapshot stands for
-- @column state_blocks              state blocks read
-- @column reads                     NIXL reads of the request
-- @column ranks                     decode ranks that read
-- @column critical_path_s           X: the slowest successful read, post to completion
-- @column slowest_rank              the rank that read it
-- @column critical_bytes            bytes of that read
-- @column aggregate_bytes           bytes of all successful reads (capacity, not latency)
-- @column prefill_s                 R: measured destination prefill time when the trace has it, else
--                                   missing_tokens / the configured prefill rate (threshold
--                                   prefill_tokens_per_s, when set), else / the engine's peak logged
--                                   prompt throughput
-- @column prefill_source            'measured', 'configured', 'estimated' or null (no way to know)
-- @column transfer_minus_prefill_s  X − R (positive: recomputing would have been faster)
CREATE OR REPLACE VIEW handoffs AS
SELECT
    r.engine_id, r.request_id, r.remote_engine_id, r.status,
    r.missing_tokens, r.transferred_tokens, r.reused_tokens, r.recomputed_tokens, r.boundary_tokens, r.state_blocks,
    r.reads, r.ranks, r.critical_path_s, r.slowest_rank, r.critical_bytes, r.aggregate_bytes,
    coalesce(r.prefill_s, r.missing_tokens / nullif(_t('prefill_tokens_per_s'), 0), r.missing_tokens / p.tokens_per_s)
        AS prefill_s,
    CASE WHEN r.prefill_s IS NOT NULL THEN 'measured'
         WHEN _t('prefill_tokens_per_s') > 0 THEN 'configured'
         WHEN p.tokens_per_s IS NOT NULL THEN 'estimated' END AS prefill_source,
    r.critical_path_s - coalesce(r.prefill_s, r.missing_tokens / nullif(_t('prefill_tokens_per_s'), 0),
                                 r.missing_tokens / p.tokens_per_s) AS transfer_minus_prefill_s
FROM _request_rows r
LEFT JOIN _peak_prefill_rate p ON p.engine_id = r.engine_id
WHERE r.has_reads;

-- _timed_prefill_handoffs: how many handoffs have a prefill time, measured or predicted from
-- the prompt rate (recompute_cheaper's inputs; the incremental analysis keeps the count).
CREATE OR REPLACE VIEW _timed_prefill_handoffs AS
SELECT count(*) AS handoffs FROM handoffs WHERE prefill_s IS NOT NULL;

-- _handoff_times: the handoffs with both a critical path X and a prefill time R, what
-- transfer_vs_recompute compares (the incremental analysis keeps these per request, and the
-- scheduled job's report reads them from there).
--
-- Columns:
--   engine_id, missing_tokens, critical_path_s, prefill_s, prefill_source   as in handoffs
CREATE OR REPLACE VIEW _handoff_times AS
SELECT engine_id, missing_tokens, critical_path_s, prefill_s, prefill_source FROM handoffs
WHERE critical_path_s IS NOT NULL AND prefill_s IS NOT NULL;

-- transfer_vs_recompute: X against R per missing-prefix bucket, at the bucket's p50, p95
-- and maximum (an average would route tail requests into a saturated link).
--
-- @column engine_id              decode engine
-- @column bucket                 power-of-four band of missing tokens ('<256', '256-1K', … '>=16K')
-- @column requests               handoffs in the bucket with both X and R
-- @column missing_p50            median missing-prefix length
-- @column missing_p95            95th percentile of the missing-prefix length
-- @column missing_max            longest missing prefix
-- @column transfer_p50_s         X: median critical path
-- @column transfer_p95_s         X: 95th percentile
-- @column transfer_max_s         X: the longest
-- @column prefill_p50_s          R: median prefill time
-- @column prefill_p95_s          R: 95th percentile
-- @column prefill_max_s          R: the longest
-- @column transfer_slower_share  share of the bucket's requests where X > R
-- @column prefill_source         'measured', 'configured', 'estimated' or 'mixed'
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
FROM _handoff_times
GROUP BY ALL
ORDER BY engine_id, min(missing_tokens);

-- route_bandwidth: effective bandwidth per engine pair and route, so a topology change shows.
--
-- @column engine_id             decode engine
-- @column remote_engine_id      prefill engine
-- @column link                  route of the reads (null when the trace does not say)
-- @column reads                 successful reads
-- @column effective_gb_s        sum of bytes / sum of transfer time (ratio of sums), GB/s
-- @column post_share            sum of post time / sum of transfer time
-- @column bytes_per_descriptor  sum of bytes / sum of descriptors
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
