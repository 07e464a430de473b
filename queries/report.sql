-- report: the data behind each chart of `hybridtrace report`, shaped, never recounted.
-- include: _macros, accounting, findings_engines, findings_requests, handoffs, intervals, link_fit, nixl
--
-- Every view here reads the accounting and findings views and only aggregates or
-- samples them, so that a store of a million requests still makes a page of a few MB.
-- Samples are deterministic (ordered by a hash of the ids), so two reports of the same
-- store show the same points. The report says, beside each chart, how many rows it drew
-- from and how many it shows.

-- _report_request_sums: what the report reads of every request's accounted reads
-- (transfer_bytes), one row per request that has one. The incremental analysis keeps these
-- per request (analysis_requests), and the scheduled job's report reads them from there
-- instead of sizing every read of the store again.
--
-- Columns:
--   engine_id, request_id    the request
--   reads_ok                 its successful accounted reads
--   excess_bytes             transported − expected summed over them
--   max_tokens               T of the request, as its accounted reads have it
CREATE OR REPLACE VIEW _report_request_sums AS
SELECT engine_id, request_id, count(*) FILTER (WHERE status = 'ok') AS reads_ok,
       sum(excess_bytes) FILTER (WHERE status = 'ok') AS excess_bytes, max(transferred_tokens) AS max_tokens
FROM transfer_bytes
GROUP BY ALL;

-- _report_share_reads: the accounted reads of each decode engine per share (the reads a
-- decode rank makes per request), those with one.
--
-- Columns:
--   engine_id    decode engine
--   share        the share
--   reads        its accounted reads that make it
CREATE OR REPLACE VIEW _report_share_reads AS
SELECT engine_id, share, count(*) AS reads FROM transfer_bytes WHERE share IS NOT NULL GROUP BY ALL;

-- _report_requests: the requests the per-request bytes chart shows: the 12 that moved
-- the most bytes over expected, then 28 more picked by hash (a fair sample of the rest).
-- Two top-N picks, not two numberings of every request: a numbering sorts them all (a
-- million requests: most of the scheduled job's report).
CREATE OR REPLACE VIEW _report_requests AS
WITH accounted AS (
    SELECT engine_id, request_id, excess_bytes FROM _report_request_sums WHERE reads_ok > 0
)
SELECT * FROM (SELECT * FROM accounted ORDER BY excess_bytes DESC, request_id LIMIT 12)
UNION
SELECT * FROM (SELECT * FROM accounted ORDER BY hash(engine_id, request_id), request_id LIMIT 28);

-- report_request_cache_bytes: bytes by cache type per sampled request, for each count.
--
-- @column engine_id     decode engine
-- @column request_id    decode-side request id
-- @column excess_bytes  transported − expected over the request's reads (the sort key)
-- @column measure       'logical', 'expected', 'reserved' or 'transported'
-- @column cache         'attention' or 'state'; transported bytes are 'unattributed' when the
--                       trace's reads carry no groups, and 'other' holds what the groups do not cover
-- @column bytes         summed over the request's successful reads (all ranks)
CREATE OR REPLACE VIEW report_request_cache_bytes AS
WITH per AS (
    SELECT b.engine_id, b.request_id, any_value(p.excess_bytes) AS excess_bytes,
           sum(b.logical_attention_bytes) AS la, sum(b.logical_state_bytes) AS ls,
           sum(b.expected_attention_bytes) AS ea, sum(b.expected_state_bytes) AS es,
           sum(b.reserved_state_bytes) AS rs,
           sum(b.attention_transported_bytes) AS ta, sum(b.state_transported_bytes) AS ts_,
           sum(b.transported_bytes) AS t,
           count(b.attention_transported_bytes) = count(*) AND count(b.state_transported_bytes) = count(*)
               AS grouped
    FROM transfer_bytes b
    JOIN _report_requests p USING (engine_id, request_id)
    WHERE b.status = 'ok'
    GROUP BY ALL
)
SELECT engine_id, request_id, excess_bytes, measure, cache, bytes
FROM (
    SELECT engine_id, request_id, excess_bytes, unnest([
        {'measure': 'logical', 'cache': 'attention', 'bytes': la},
        {'measure': 'logical', 'cache': 'state', 'bytes': ls},
        {'measure': 'expected', 'cache': 'attention', 'bytes': ea},
        {'measure': 'expected', 'cache': 'state', 'bytes': es},
        {'measure': 'reserved', 'cache': 'attention', 'bytes': ea},
        {'measure': 'reserved', 'cache': 'state', 'bytes': rs},
        {'measure': 'transported', 'cache': 'attention', 'bytes': CASE WHEN grouped THEN ta END},
        {'measure': 'transported', 'cache': 'state', 'bytes': CASE WHEN grouped THEN ts_ END},
        {'measure': 'transported', 'cache': 'other', 'bytes': CASE WHEN grouped THEN t - ta - ts_ END},
        {'measure': 'transported', 'cache': 'unattributed', 'bytes': CASE WHEN NOT grouped THEN t END}
    ], recursive := true)
    FROM per
)
WHERE bytes IS NOT NULL AND bytes <> 0;

-- _report_read_sample: the successful reads report_reads draws, the 4,000 of lowest hash
-- (the scheduled job's report sizes only their requests' reads).
--
-- Columns:
--   every column of transfers
CREATE OR REPLACE VIEW _report_read_sample AS
SELECT * FROM transfers WHERE status = 'ok'
ORDER BY hash(engine_id, request_id, rank, remote_rank), request_id
LIMIT 4000;

-- report_reads: up to 4,000 successful reads, picked by hash, for the payload and
-- descriptor scatter plots. Every read has its timing and descriptors; the byte counts
-- are null where no byte model sizes the engine (the payload plot then has no points).
--
-- @column engine_id           decode engine
-- @column request_id          decode-side request id
-- @column rank                decode TP rank
-- @column transferred_tokens  T of its request (null without a sized model)
-- @column state_blocks        J of its request (null without a sized model)
-- @column transported_bytes   what NIXL reported
-- @column expected_bytes      what a correct connector moves
-- @column excess_bytes        transported − expected
-- @column descriptors         descriptors of the read
-- @column post_ms             post time, ms
-- @column xfer_ms             transfer time, ms
-- @column post_share          post_s / xfer_s
CREATE OR REPLACE VIEW report_reads AS
SELECT t.engine_id, t.request_id, t.rank, b.transferred_tokens, b.state_blocks,
       t.transported_bytes, b.expected_bytes, b.excess_bytes,
       t.descriptors, t.post_s * 1e3 AS post_ms, t.xfer_s * 1e3 AS xfer_ms,
       t.post_s / nullif(t.xfer_s, 0) AS post_share
FROM _report_read_sample t
LEFT JOIN transfer_bytes b USING (engine_id, request_id, rank, remote_engine_id, remote_rank, ts)
ORDER BY hash(t.engine_id, t.request_id, t.rank, t.remote_rank), t.request_id;

-- report_model_lines: the byte model's payload of one read against tokens, per decode
-- engine: logical B·T + S (one snapshot) and expected (whole blocks), at 64 points from
-- 0 to the largest T the store holds, and the crossover S/B where state and attention
-- bytes are equal. A read carries 1/share of its decode rank's bytes (share: the reads a
-- decode rank makes per request, more than one when the prefill engine has more ranks),
-- so the lines are drawn per read, at the engine's most common share (of two as common,
-- the smaller).
--
-- @column engine_id         decode engine
-- @column tokens            T
-- @column logical_bytes     (B·T + S) / share
-- @column expected_bytes    (ceil(T / block)·block·B + S) / share
-- @column crossover_tokens  S / B (null for a model without attention)
-- @column share             reads per decode rank and request the lines are drawn for
CREATE OR REPLACE VIEW report_model_lines AS
WITH span AS (
    SELECT t.engine_id, t.max_tokens, s.share
    FROM (SELECT engine_id, max(max_tokens) AS max_tokens FROM _report_request_sums GROUP BY engine_id) t
    LEFT JOIN (SELECT engine_id, (list(share ORDER BY reads DESC, share))[1] AS share
               FROM _report_share_reads GROUP BY engine_id) s USING (engine_id)
)
SELECT m.engine_id, g.step * s.max_tokens // 64 AS tokens,
       (m.attention_bytes_per_token * (g.step * s.max_tokens // 64) + m.state_bytes) // s.share AS logical_bytes,
       CASE WHEN m.block_tokens IS NULL THEN m.state_bytes
            ELSE ((g.step * s.max_tokens // 64) + m.block_tokens - 1) // m.block_tokens * m.block_tokens
                 * m.attention_bytes_per_token + m.state_bytes END // s.share AS expected_bytes,
       m.state_bytes / nullif(m.attention_bytes_per_token, 0) AS crossover_tokens,
       s.share
FROM engine_models m
JOIN span s USING (engine_id)
CROSS JOIN (SELECT unnest(range(0, 65)) AS step) g
WHERE m.error IS NULL AND s.share >= 1;

-- _report_slow_ranks: the decode ranks finding_slow_rank names (the report reads them from
-- the analysis it just ran instead of running the rule again).
--
-- Columns:
--   engine_id, rank    the rank
CREATE OR REPLACE VIEW _report_slow_ranks AS
SELECT DISTINCT engine_id, rank FROM finding_slow_rank;

-- report_ranks: completion time and effective bandwidth of every decode rank.
--
-- @column engine_id       decode engine
-- @column rank            decode TP rank
-- @column reads           successful reads
-- @column p50_xfer_ms     median completion time of one read (post to observed end)
-- @column p90_xfer_ms     90th percentile of it
-- @column max_xfer_ms     the slowest read
-- @column effective_gb_s  bytes / transfer time over its reads (ratio of sums)
-- @column slow            true when finding_slow_rank names the rank
CREATE OR REPLACE VIEW report_ranks AS
SELECT t.engine_id, t.rank, count(*) AS reads,
       quantile_cont(t.xfer_s, 0.5) * 1e3 AS p50_xfer_ms,
       quantile_cont(t.xfer_s, 0.9) * 1e3 AS p90_xfer_ms,
       max(t.xfer_s) * 1e3 AS max_xfer_ms,
       sum(t.transported_bytes) / nullif(sum(t.xfer_s), 0) / 1e9 AS effective_gb_s,
       bool_or(s.rank IS NOT NULL) AS slow
FROM transfers t
LEFT JOIN _report_slow_ranks s USING (engine_id, rank)
WHERE t.status = 'ok'
GROUP BY ALL
ORDER BY t.engine_id, t.rank;

-- report_recompute: transfer_vs_recompute in long form (one row per bucket, statistic
-- and side) for a line chart.
--
-- @column engine_id       decode engine
-- @column bucket          as in transfer_vs_recompute
-- @column requests        as in transfer_vs_recompute
-- @column bucket_order    sort key: the bucket's median missing prefix
-- @column prefill_source  'measured', 'configured', 'estimated' or 'mixed'
-- @column statistic       'p50', 'p95' or 'max'
-- @column side            'transfer (X)' or 'recompute (R)'
-- @column seconds         the value
CREATE OR REPLACE VIEW report_recompute AS
SELECT engine_id, bucket, requests, missing_p50 AS bucket_order, prefill_source,
       unnest([
           {'statistic': 'p50', 'side': 'transfer (X)', 'seconds': transfer_p50_s},
           {'statistic': 'p95', 'side': 'transfer (X)', 'seconds': transfer_p95_s},
           {'statistic': 'max', 'side': 'transfer (X)', 'seconds': transfer_max_s},
           {'statistic': 'p50', 'side': 'recompute (R)', 'seconds': prefill_p50_s},
           {'statistic': 'p95', 'side': 'recompute (R)', 'seconds': prefill_p95_s},
           {'statistic': 'max', 'side': 'recompute (R)', 'seconds': prefill_max_s}
       ], recursive := true)
FROM transfer_vs_recompute;

-- report_intervals: the native-metrics timeline, at most 400 points per engine and
-- source: intervals are merged into equal time bins when there are more.
--
-- @column engine_id          engine of the series
-- @column source_kind        'log' or 'prometheus'
-- @column end_ts             end of the bin (epoch s)
-- @column transfers          successful transfers in the bin
-- @column throughput_mib_s   MiB per second of transfer time (weighted by transfers)
-- @column mib_per_transfer   MiB per transfer (weighted by transfers)
-- @column failed_transfers   failed transfers in the bin (null when not reported)
-- @column expired_requests   expired requests in the bin (null when not reported)
CREATE OR REPLACE VIEW report_intervals AS
WITH span AS (
    SELECT engine_id, source_kind, min(end_ts) AS t0, max(end_ts) AS t1, count(*) AS n
    FROM intervals GROUP BY ALL
)
SELECT i.engine_id, i.source_kind,
       max(i.end_ts) AS end_ts,
       sum(i.transfers) AS transfers,
       sum(i.throughput_mib_s * i.transfers) / nullif(sum(i.transfers), 0) AS throughput_mib_s,
       sum(i.avg_mib_per_transfer * i.transfers) / nullif(sum(i.transfers), 0) AS mib_per_transfer,
       sum(i.failed_transfers) AS failed_transfers,
       sum(i.expired_requests) AS expired_requests
FROM intervals i
JOIN span s USING (engine_id, source_kind)
GROUP BY i.engine_id, i.source_kind,
         CASE WHEN s.n <= 400 THEN i.end_ts
              ELSE floor((i.end_ts - s.t0) / ((s.t1 - s.t0) / 400.0 + 1e-9)) END
ORDER BY 1, 2, 3;

-- report_engines: each engine's configuration as its records and byte model say; an engine
-- only its reads or metrics name has a row too, with what is known.
--
-- @column engine_id              the engine
-- @column role                   'prefill' or 'decode', when a record says
-- @column model                  the model it serves
-- @column tp_size                TP size
-- @column kv_cache_dtype         KV cache dtype (as logged or traced; else the model's)
-- @column mamba_ssm_cache_dtype  SSM state dtype (as logged or traced; else the model's)
-- @column kv_layout              KV layout
-- @column mamba_cache_mode       Mamba prefix-caching mode
-- @column block_tokens           attention block size (logged, else the model's)
-- @column mamba_padding_pct      allocator padding of the state page (percent)
-- @column host_staging           true when the KV cache sits in a host buffer; null when no record says
-- @column vllm_version           when a record says
CREATE OR REPLACE VIEW report_engines AS
WITH e AS (
    -- each setting as the engine's newest record says it (_engine_newest, store/engine_settings.py)
    SELECT engine_id, role, model, tp_size, kv_cache_dtype, mamba_ssm_cache_dtype AS ssm_dtype,
           kv_layout, mamba_cache_mode, block_tokens, mamba_padding_pct AS padding_pct,
           -- staged as staging_copy judges it (_host_buffer_engines); a record that says
           -- nothing either way leaves it unknown, not "no"
           CASE WHEN engine_id IN (SELECT engine_id FROM _host_buffer_engines) THEN true
                WHEN use_host_buffer IS NOT NULL OR kv_buffer_device IS NOT NULL THEN false
           END AS host_staging,
           vllm_version
    FROM _engine_newest
),
-- every engine the store names, though only its reads or metrics know it
ids AS (
    SELECT engine_id FROM e
    UNION SELECT engine_id FROM engine_models
    UNION SELECT DISTINCT engine_id FROM intervals WHERE engine_id IS NOT NULL
    UNION SELECT DISTINCT engine_id FROM transfers
    UNION SELECT DISTINCT remote_engine_id FROM transfers WHERE remote_engine_id IS NOT NULL
)
SELECT ids.engine_id, e.role, coalesce(m.model, e.model) AS model,
       coalesce(e.tp_size, m.tp_size) AS tp_size,
       coalesce(e.kv_cache_dtype, m.kv_cache_dtype) AS kv_cache_dtype,
       coalesce(e.ssm_dtype, m.mamba_ssm_cache_dtype) AS mamba_ssm_cache_dtype,
       e.kv_layout, e.mamba_cache_mode,
       coalesce(e.block_tokens, m.block_tokens) AS block_tokens,
       coalesce(e.padding_pct, m.mamba_padding_pct) AS mamba_padding_pct,
       e.host_staging, e.vllm_version
FROM ids
LEFT JOIN e USING (engine_id)
LEFT JOIN engine_models m USING (engine_id)
ORDER BY e.role NULLS LAST, 1;

-- _report_fit_groups: the rank fits the link-fit chart draws, each with a label.
CREATE OR REPLACE VIEW _report_fit_groups AS
SELECT *, engine_id || coalesce(' ← ' || remote_engine_id, '') || ' · rank ' || rank
          || coalesce(' · ' || link, '') AS fit
FROM link_fits WHERE scope = 'rank';

-- report_link_fit_points: up to 300 of the reads each rank fit used, picked by hash: bytes
-- against transfer time (the connector trace's reads, or NIXL's ring transfers when the
-- fits come from those).
--
-- @column fit         the fit's label: decode engine ← prefill engine · rank · route
-- @column bytes       bytes of the read
-- @column xfer_ms     its transfer time, ms
-- @column descriptors its descriptors (null for ring transfers)
CREATE OR REPLACE VIEW report_link_fit_points AS
WITH reads AS (
    SELECT g.fit, t.transported_bytes AS bytes, t.xfer_s * 1e3 AS xfer_ms, t.descriptors,
           hash(t.engine_id, t.request_id, t.rank, t.remote_rank, t.ts) AS pick
    FROM transfers t
    JOIN _report_fit_groups g
      ON g.source = 'trace' AND g.engine_id = t.engine_id AND g.remote_engine_id = t.remote_engine_id
     AND g.rank = t.rank AND g.link IS NOT DISTINCT FROM t.link
    WHERE t.status = 'ok' AND t.xfer_s > 0
    UNION ALL
    SELECT g.fit, n.transported_bytes, n.xfer_us / 1e3, CAST(NULL AS BIGINT), hash(n.agent, n.seq, n.snapshot_id)
    FROM nixl_transfer_ranks n
    JOIN _report_fit_groups g ON g.source = 'nixl' AND g.engine_id = n.engine_id AND g.rank = n.rank
    WHERE n.xfer_us > 0
)
SELECT fit, bytes, xfer_ms, descriptors FROM reads
QUALIFY row_number() OVER (PARTITION BY fit ORDER BY pick) <= 300
ORDER BY fit, bytes, pick;

-- report_link_fit_lines: each rank fit's line, at no bytes and at the most bytes its reads
-- moved: fixed + bytes / bandwidth, plus the descriptors those bytes take at the reads'
-- bytes per descriptor times the per-descriptor cost.
--
-- @column fit               as in report_link_fit_points
-- @column bytes             0, or the most bytes of one read
-- @column xfer_ms           the fitted transfer time, ms
-- @column fixed_s           the fit's fixed cost, s
-- @column bandwidth_gb_s    its bandwidth, decimal GB/s
-- @column per_descriptor_s  its per-descriptor cost, s
-- @column transfers_used    reads the fit used
-- @column median_error_pct  its quality (median error, %)
CREATE OR REPLACE VIEW report_link_fit_lines AS
SELECT g.fit, e.bytes,
       (g.fixed_s + coalesce(e.bytes / g.bandwidth_bytes_per_s, 0)
        + coalesce(e.bytes / g.bytes_per_descriptor * g.per_descriptor_s, 0)) * 1e3 AS xfer_ms,
       g.fixed_s, g.bandwidth_bytes_per_s / 1e9 AS bandwidth_gb_s, g.per_descriptor_s, g.transfers_used,
       g.median_error_pct
FROM _report_fit_groups g
JOIN (SELECT fit, unnest([0, max(bytes)]) AS bytes FROM report_link_fit_points GROUP BY fit) e USING (fit)
ORDER BY g.fit, e.bytes;
