-- rank_bandwidth: effective bandwidth of every decode rank, per prefill engine and route.
--
-- One row per (engine_id, rank, remote_engine_id, link). Effective bandwidth is a ratio
-- of sums: all bytes the rank read over all the time its reads took (post start to
-- observed completion, so polling delay is inside). It is not the mean of per-read
-- rates, and it is not the link's peak.
--
-- Columns:
--   engine_id            decode engine
--   rank                 decode TP rank
--   remote_engine_id     prefill engine read from
--   link                 route of the reads (null when the trace does not say)
--   reads                successful reads (status = 'ok')
--   failed_reads         reads with status failed or expired
--   transported_bytes    bytes NIXL reported over the successful reads
--   xfer_s               summed transfer time of the successful reads, seconds
--   p50_xfer_s           median transfer time of one read, seconds
--   max_xfer_s           slowest read, seconds
--   effective_gb_s       transported_bytes / xfer_s / 1e9 (decimal GB/s); null with no time
--   post_share           summed post time / summed transfer time: how much is descriptor posting
CREATE OR REPLACE VIEW rank_bandwidth AS
SELECT
    engine_id,
    rank,
    remote_engine_id,
    link,
    count(*) FILTER (WHERE status = 'ok') AS reads,
    count(*) FILTER (WHERE status <> 'ok') AS failed_reads,
    sum(transported_bytes) FILTER (WHERE status = 'ok') AS transported_bytes,
    sum(xfer_s) FILTER (WHERE status = 'ok') AS xfer_s,
    median(xfer_s) FILTER (WHERE status = 'ok') AS p50_xfer_s,
    max(xfer_s) FILTER (WHERE status = 'ok') AS max_xfer_s,
    sum(transported_bytes) FILTER (WHERE status = 'ok')
        / nullif(sum(xfer_s) FILTER (WHERE status = 'ok'), 0) / 1e9 AS effective_gb_s,
    sum(post_s) FILTER (WHERE status = 'ok')
        / nullif(sum(xfer_s) FILTER (WHERE status = 'ok'), 0) AS post_share
FROM transfers
GROUP BY ALL;
