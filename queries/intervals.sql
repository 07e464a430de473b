-- intervals: one row per `KV Transfer metrics` log line or Prometheus scrape delta (vLLM's, pooled), and SGLang's per rank.
-- include: _instances
--
-- Log rows come as parsed (_intervals_log). Scrape rows are differences between two
-- consecutive scrapes of the same series: vLLM's NIXL histograms and counters are
-- cumulative, so an interval's transfers are the growth of `_count`, its bytes the
-- growth of `vllm:nixl_bytes_transferred_sum`, and so on. A value lower than the one
-- before means the process restarted (a counter reset): the new value is the delta.
-- The first scrape of a series has nothing to subtract from and yields no row.
--
-- What each column of the `intervals` table (docs/tables.md) holds here:
--   start_ts, end_ts       the interval (previous scrape or log line → this one), epoch s
--   engine_id              engine, resolved through _instance_engines for scrapes
--   source_kind            'log' or 'prometheus'
--   process                logging process, or 'engine=<index>' for scrapes (then the target
--                          of a federated scrape, 'engine=0 pod=decode-0,job=vllm')
--   transfers              successful rank-level transfers completed in the interval
--   avg_xfer_s, avg_post_s mean transfer and post time (ratio of sums for scrapes)
--   p90_xfer_s, p90_post_s 90th percentile; for scrapes the upper bound of the histogram
--                          bucket that holds it (buckets cannot say more)
--   avg_mib_per_transfer   MiB per transfer (vLLM's "MB")
--   throughput_mib_s       MiB over summed transfer time (vLLM's "MB/s")
--   avg_descriptors        descriptors per transfer
--   transported_bytes      exact bytes of the interval (scrapes only; logs print rounded MiB)
--   failed_transfers       failed transfers in the interval (scrapes; logs when printed)
--   expired_requests       KV-expired requests in the interval (scrapes; logs when printed)
--   line_hash              hash of the log line's text (null for scrapes): tells lines of one second apart

-- prom_deltas: every kept Prometheus series as per-scrape differences.
--
-- One row per series and scrape after its first: vLLM's vllm:nixl_* and
-- vllm:prompt_tokens_by_source_total, and NIXL's agent_* exporter (agent_rx_bytes_total,
-- agent_xfer_time_us_sum, ...). A restart resets every counter of the process at once,
-- so a scrape is a reset for all series of its instance, target and engine label when
-- any of their counters went down, or a `_created` time changed (which shows a restart
-- even when the new counts have already passed the old ones): then each delta is the new
-- value. Gauges (agent_*_last_*) are differenced too, but never decide a reset: read
-- them from prom_samples instead.
--
-- The target tells apart the servers a federated scrape (Prometheus' /federate, one file
-- holding many pods) carries: the scrape-target labels a collector adds (pod, instance,
-- job, namespace, container, node), as "pod=…,instance=…"; empty for a server's own
-- /metrics, whose series carry none of them.
--
-- @column instance      path of the folder the scrape was found in
-- @column target        the scraped server of a federated scrape ("pod=…,instance=…"); empty otherwise
-- @column engine_label  vLLM's engine index label
-- @column model_name    the model_name label
-- @column metric        metric name
-- @column labels        the series' other labels, as JSON text
-- @column le            histogram bucket bound (null for other series)
-- @column ts            this scrape's time, epoch s
-- @column prev_ts       the series' scrape before it
-- @column delta         growth since prev_ts (the new value after a reset)
-- @column source_id     the scrape's source (sources.source_id)
-- @column line_number   line of this scrape's sample
-- @column day           UTC day of ts
CREATE OR REPLACE VIEW prom_deltas AS
WITH series AS (
    -- each series once, numbered, with what depends on the series alone: the window below
    -- sorts by a number instead of four strings, and the target and the kind of counter are
    -- worked out once per series instead of once per sample (both were most of the view's
    -- time on a week of scrapes)
    SELECT instance, metric, labels, le, row_number() OVER () AS series_id,
           concat_ws(',', 'pod=' || json_extract_string(labels, '$.pod'),
                     'instance=' || json_extract_string(labels, '$.instance'),
                     'job=' || json_extract_string(labels, '$.job'),
                     'namespace=' || json_extract_string(labels, '$.namespace'),
                     'container=' || json_extract_string(labels, '$.container'),
                     'node=' || json_extract_string(labels, '$.node')) AS target,
           -- 1: a `_created` time (a change is a restart); 2: a counter (a drop is a reset)
           CASE WHEN metric LIKE '%\_created' ESCAPE '\' THEN 1
                WHEN regexp_matches(metric, '_(total|count|sum|bucket)$') THEN 2 ELSE 0 END AS counter_kind
    FROM (SELECT DISTINCT instance, metric, labels, le FROM prom_samples)
),
steps AS (
    SELECT p.instance, s.target, p.engine_label, p.model_name, p.metric, p.labels, p.le, p.ts, p.value,
           s.counter_kind, lag(p.ts) OVER w AS prev_ts, lag(p.value) OVER w AS prev_value,
           p.source_id, p.line_number, p.day
    FROM prom_samples p
    JOIN series s
      ON s.instance IS NOT DISTINCT FROM p.instance AND s.metric IS NOT DISTINCT FROM p.metric
     AND s.labels IS NOT DISTINCT FROM p.labels AND s.le IS NOT DISTINCT FROM p.le
    WINDOW w AS (PARTITION BY s.series_id ORDER BY p.ts)
),
resets AS (
    SELECT instance, target, engine_label, ts,
           bool_or(CASE counter_kind WHEN 1 THEN value <> prev_value WHEN 2 THEN value < prev_value
                   ELSE false END) AS reset
    FROM steps
    WHERE prev_value IS NOT NULL
    GROUP BY ALL
)
SELECT s.instance, s.target, s.engine_label, s.model_name, s.metric, s.labels, s.le, s.ts, s.prev_ts,
       CASE WHEN r.reset OR s.value < s.prev_value THEN s.value ELSE s.value - s.prev_value END AS delta,
       s.source_id, s.line_number, s.day
FROM steps s
JOIN resets r
  ON r.instance = s.instance AND r.target = s.target AND r.engine_label IS NOT DISTINCT FROM s.engine_label
 AND r.ts = s.ts
WHERE s.prev_ts IS NOT NULL;

CREATE OR REPLACE VIEW _prom_deltas AS
SELECT * FROM prom_deltas WHERE metric LIKE 'vllm:nixl_%';

-- _prom_p90: per scrape and histogram family, the upper bound of the bucket that holds the
-- 90th percentile of the interval's observations (the bucket's growth against the growth of
-- the family's _count).
--
-- Columns:
--   instance, target, engine_label, model_name, ts   the scrape, as prom_deltas has them
--   family                                           the histogram (its bucket metric without _bucket)
--   p90_upper                                        that bucket's le (null when nothing was observed)
CREATE OR REPLACE VIEW _prom_p90 AS
WITH buckets AS (
    -- the family by cutting `_bucket` off the name: a regular expression on every held delta,
    -- once per family the intervals read, cost more than the join below
    SELECT *,
           suffix(metric, '_bucket') AS is_bucket,
           CASE WHEN is_bucket THEN left(metric, length(metric) - 7) ELSE metric END AS family,
           CASE WHEN is_bucket THEN family || '_count' ELSE metric END AS count_metric
    FROM _prom_deltas
    WHERE le IS NOT NULL AND delta IS NOT NULL
)
SELECT
    d.instance, d.target, d.engine_label, d.model_name, d.ts, d.family,
    min(d.le) FILTER (WHERE d.delta >= 0.9 * c.delta AND c.delta > 0) AS p90_upper
FROM buckets d
JOIN _prom_deltas c
  ON c.instance = d.instance AND c.labels = d.labels AND c.ts = d.ts
 AND c.metric = d.count_metric AND c.le IS NULL
GROUP BY ALL;

-- _prom_scrape_intervals: one row per scrape (instance, target, engine label, model name, time)
-- after the first of its series: what `_prom_intervals` says of it before the instance is
-- resolved to its engine. A scrape's row depends on its own samples and each of their series'
-- sample before it only, so the incremental analysis keeps these rows in its state
-- (analysis_scrapes) and recomputes only the scrapes new samples make or change; the engine
-- of an instance can be named later (a log arriving in the folder), so it is resolved when read.
CREATE OR REPLACE VIEW _prom_scrape_intervals AS
WITH per_scrape AS (
    SELECT
        instance, target, engine_label, model_name, ts,
        any_value(prev_ts) AS prev_ts,
        sum(delta) FILTER (WHERE metric = 'vllm:nixl_xfer_time_seconds_count') AS n,
        sum(delta) FILTER (WHERE metric = 'vllm:nixl_xfer_time_seconds_sum') AS xfer_sum,
        sum(delta) FILTER (WHERE metric = 'vllm:nixl_post_time_seconds_sum') AS post_sum,
        sum(delta) FILTER (WHERE metric = 'vllm:nixl_bytes_transferred_sum') AS bytes_sum,
        sum(delta) FILTER (WHERE metric = 'vllm:nixl_num_descriptors_sum') AS desc_sum,
        sum(delta) FILTER (WHERE metric = 'vllm:nixl_num_failed_transfers_total') AS failed,
        sum(delta) FILTER (WHERE metric = 'vllm:nixl_num_kv_expired_reqs_total') AS expired,
        -- the source of its first line: a scrape read in two slices of its file has a source
        -- for each, and any of them would make two analyses of one store disagree
        arg_min(source_id, line_number) AS source_id,
        min(line_number) AS line_number,
        any_value(day) AS day
    FROM _prom_deltas
    WHERE le IS NULL AND delta IS NOT NULL
    GROUP BY instance, target, engine_label, model_name, ts
)
SELECT
    s.instance, s.target, s.engine_label, s.model_name,
    s.prev_ts AS start_ts,
    s.ts AS end_ts,
    'engine=' || coalesce(s.engine_label, '') || CASE WHEN s.target <> '' THEN ' ' || s.target ELSE '' END
        AS process,
    CAST(s.n AS BIGINT) AS transfers,
    s.xfer_sum / nullif(s.n, 0) AS avg_xfer_s,
    x.p90_upper AS p90_xfer_s,
    s.post_sum / nullif(s.n, 0) AS avg_post_s,
    p.p90_upper AS p90_post_s,
    s.bytes_sum / 1048576.0 / nullif(s.n, 0) AS avg_mib_per_transfer,
    s.bytes_sum / 1048576.0 / nullif(s.xfer_sum, 0) AS throughput_mib_s,
    s.desc_sum / nullif(s.n, 0) AS avg_descriptors,
    CAST(s.bytes_sum AS BIGINT) AS transported_bytes,
    CAST(s.failed AS BIGINT) AS failed_transfers,
    CAST(s.expired AS BIGINT) AS expired_requests,
    s.day,
    s.source_id,
    s.line_number
FROM per_scrape s
LEFT JOIN _prom_p90 x
  ON x.instance = s.instance AND x.target = s.target AND x.ts = s.ts
 AND x.engine_label IS NOT DISTINCT FROM s.engine_label
 AND x.model_name IS NOT DISTINCT FROM s.model_name AND x.family = 'vllm:nixl_xfer_time_seconds'
LEFT JOIN _prom_p90 p
  ON p.instance = s.instance AND p.target = s.target AND p.ts = s.ts
 AND p.engine_label IS NOT DISTINCT FROM s.engine_label
 AND p.model_name IS NOT DISTINCT FROM s.model_name AND p.family = 'vllm:nixl_post_time_seconds';

-- _prom_intervals: the scrapes' intervals as the `intervals` table has them, each instance's
-- engine resolved.
CREATE OR REPLACE VIEW _prom_intervals AS
SELECT
    s.start_ts, s.end_ts,
    coalesce(e.engine_id, regexp_extract(s.instance, '([^/]+)$', 1)) AS engine_id,
    'prometheus' AS source_kind,
    -- each column named (an EXCLUDE list is printed in no fixed order in the view's text, which
    -- the connections' kept tables are keyed by: store/catalog.py)
    s.process, s.transfers, s.avg_xfer_s, s.p90_xfer_s, s.avg_post_s, s.p90_post_s, s.avg_mib_per_transfer,
    s.throughput_mib_s, s.avg_descriptors, s.transported_bytes, s.failed_transfers, s.expired_requests,
    s.day, s.source_id, s.line_number
FROM _prom_scrape_intervals s
-- an instance is a path; a store written before paths were kept has the folder's name
LEFT JOIN _instance_engines e
  ON e.instance = s.instance OR (s.instance NOT LIKE '%/%' AND e.folder = s.instance);

-- intervals: the log's intervals and the scrapes' deltas, as the `intervals` table
-- (docs/tables.md) describes them.
--
-- A log interval starts where the engine process's previous line (for the same engine
-- index) ended, whichever file (a rotated part, an earlier read) that line came from.
-- Lines of one second follow each other in the order they were written.
--
-- @columns-of intervals
CREATE OR REPLACE VIEW intervals AS
SELECT * REPLACE (
    coalesce(lag(end_ts) OVER (PARTITION BY engine_id, process, engine_index ORDER BY end_ts, line_number),
             start_ts) AS start_ts
)
FROM _intervals_log
UNION ALL BY NAME
SELECT * FROM _prom_intervals;

-- sglang_rank_intervals: SGLang's KV-transfer histograms as per-rank intervals, beside the
-- pooled ones of vLLM's scrapes in `intervals`.
--
-- An SGLang scheduler observes each request's transfer into the `sglang:kv_transfer_*`
-- histograms, labelled with its tp_rank, pp_rank and dp_rank; a scrape holds every rank's
-- series. One row per instance, target, series labels and scrape after the series' first:
-- the growth of each histogram's _count and _sum (prom_deltas, resets included). MB and GB/s
-- are SGLang's: MiB and GiB/s. The latency, size and speed histograms are observed on the
-- prefill (sending) side; bootstrap and allocation on both. Releases that kept these as
-- gauges (the last request's figure) give no rows: a gauge has no growth to read.
-- engine_id is the folder's engine: a data-parallel rank is `dp_rank`, since the scrape
-- cannot tell whether the log named it an engine of its own (it does when DP is above one).
--
-- @column start_ts               the previous scrape of the series, epoch s
-- @column end_ts                 this scrape, epoch s
-- @column engine_id              engine of the scrape's folder (_instance_engines)
-- @column instance               path of the folder the scrape was found in
-- @column target                 the scraped server of a federated scrape; empty otherwise
-- @column tp_rank                the tp_rank label
-- @column pp_rank                the pp_rank label
-- @column dp_rank                the dp_rank label (null when the series has none)
-- @column transfers              transfers the rank finished in the interval (latency _count)
-- @column avg_latency_s          mean transfer latency, seconds (ratio of sums)
-- @column p90_latency_s          upper bound of the latency bucket holding the 90th percentile, seconds
-- @column transported_bytes      bytes the transfers reported (kv_transfer_total_mb _sum × 2²⁰)
-- @column avg_mib_per_transfer   MiB per transfer
-- @column throughput_mib_s       MiB over the summed latency
-- @column avg_reported_gib_s     mean of the per-transfer speeds SGLang reported, GiB/s
-- @column avg_bootstrap_s        mean bootstrap time, seconds
-- @column avg_alloc_s            mean wait for KV allocation, seconds
-- @column failed_transfers       requests whose transfer failed (num_transfer_failed_reqs_total)
-- @column failed_bootstraps      requests whose bootstrap failed (num_bootstrap_failed_reqs_total)
-- @column source_id              the scrape's source (sources.source_id)
-- @column line_number            first line of this scrape's samples of the rank
-- @column day                    UTC day of end_ts
CREATE OR REPLACE VIEW sglang_rank_intervals AS
WITH d AS (
    SELECT * FROM prom_deltas WHERE metric LIKE 'sglang:%' AND delta IS NOT NULL
),
p90 AS (
    SELECT b.instance, b.target, b.labels, b.ts,
           min(b.le) FILTER (WHERE b.delta >= 0.9 * c.delta AND c.delta > 0) AS p90_ms
    FROM d b
    JOIN d c
      ON c.instance = b.instance AND c.target = b.target AND c.labels = b.labels AND c.ts = b.ts
     AND c.metric = 'sglang:kv_transfer_latency_ms_count'
    WHERE b.metric = 'sglang:kv_transfer_latency_ms_bucket'
    GROUP BY ALL
),
per_scrape AS (
    SELECT instance, target, labels, ts,
           any_value(prev_ts) AS prev_ts,
           sum(delta) FILTER (WHERE metric = 'sglang:kv_transfer_latency_ms_count') AS n,
           sum(delta) FILTER (WHERE metric = 'sglang:kv_transfer_latency_ms_sum') AS latency_ms,
           sum(delta) FILTER (WHERE metric = 'sglang:kv_transfer_total_mb_count') AS size_n,
           sum(delta) FILTER (WHERE metric = 'sglang:kv_transfer_total_mb_sum') AS mib,
           sum(delta) FILTER (WHERE metric = 'sglang:kv_transfer_speed_gb_s_count') AS speed_n,
           sum(delta) FILTER (WHERE metric = 'sglang:kv_transfer_speed_gb_s_sum') AS gib_s,
           sum(delta) FILTER (WHERE metric = 'sglang:kv_transfer_bootstrap_ms_count') AS bootstrap_n,
           sum(delta) FILTER (WHERE metric = 'sglang:kv_transfer_bootstrap_ms_sum') AS bootstrap_ms,
           sum(delta) FILTER (WHERE metric = 'sglang:kv_transfer_alloc_ms_count') AS alloc_n,
           sum(delta) FILTER (WHERE metric = 'sglang:kv_transfer_alloc_ms_sum') AS alloc_ms,
           sum(delta) FILTER (WHERE metric = 'sglang:num_transfer_failed_reqs_total') AS failed,
           sum(delta) FILTER (WHERE metric = 'sglang:num_bootstrap_failed_reqs_total') AS bootstrap_failed,
           -- a family whose growth nothing here reads (a gauge) makes no interval of its own
           count(*) FILTER (WHERE regexp_matches(metric, '_(count|sum|total)$')) AS read_samples,
           arg_min(source_id, line_number) AS source_id,  -- its first line's, as in _prom_intervals
           min(line_number) AS line_number,
           any_value(day) AS day
    FROM d
    WHERE le IS NULL
    GROUP BY instance, target, labels, ts
)
SELECT
    s.prev_ts AS start_ts,
    s.ts AS end_ts,
    coalesce(e.engine_id, regexp_extract(s.instance, '([^/]+)$', 1)) AS engine_id,
    s.instance,
    s.target,
    TRY_CAST(json_extract_string(s.labels, '$.tp_rank') AS INTEGER) AS tp_rank,
    TRY_CAST(json_extract_string(s.labels, '$.pp_rank') AS INTEGER) AS pp_rank,
    TRY_CAST(json_extract_string(s.labels, '$.dp_rank') AS INTEGER) AS dp_rank,
    CAST(s.n AS BIGINT) AS transfers,
    s.latency_ms / 1000.0 / nullif(s.n, 0) AS avg_latency_s,
    p.p90_ms / 1000.0 AS p90_latency_s,
    CAST(round(s.mib * 1048576.0) AS BIGINT) AS transported_bytes,
    s.mib / nullif(s.size_n, 0) AS avg_mib_per_transfer,
    s.mib / nullif(s.latency_ms / 1000.0, 0) AS throughput_mib_s,
    s.gib_s / nullif(s.speed_n, 0) AS avg_reported_gib_s,
    s.bootstrap_ms / 1000.0 / nullif(s.bootstrap_n, 0) AS avg_bootstrap_s,
    s.alloc_ms / 1000.0 / nullif(s.alloc_n, 0) AS avg_alloc_s,
    CAST(s.failed AS BIGINT) AS failed_transfers,
    CAST(s.bootstrap_failed AS BIGINT) AS failed_bootstraps,
    s.source_id,
    s.line_number,
    s.day
FROM per_scrape s
LEFT JOIN _instance_engines e
  ON e.instance = s.instance OR (s.instance NOT LIKE '%/%' AND e.folder = s.instance)
LEFT JOIN p90 p ON p.instance = s.instance AND p.target = s.target AND p.labels = s.labels AND p.ts = s.ts
WHERE s.read_samples > 0;
