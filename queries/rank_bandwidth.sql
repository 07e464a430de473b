-- rank_bandwidth: effective bandwidth of every decode rank, per prefill engine and route.
-- include:
--
-- One row per (engine_id, rank, remote_engine_id, link). Effective bandwidth is a ratio
-- of sums: all bytes the rank read over all the time its reads took (post start to
-- observed completion, so polling delay is inside). It is not the mean of per-read
-- rates, and it is not the link's peak.
--
-- @column engine_id            decode engine
-- @column rank                 decode TP rank
-- @column remote_engine_id     prefill engine read from
-- @column link                 route of the reads (null when the trace does not say)
-- @column reads                successful reads (status = 'ok')
-- @column failed_reads         reads with status failed or expired
-- @column transported_bytes    bytes NIXL reported over the successful reads
-- @column xfer_s               summed transfer time of the successful reads, seconds
-- @column p50_xfer_s           median transfer time of one read, seconds
-- @column max_xfer_s           slowest read, seconds
-- @column effective_gb_s       transported_bytes / xfer_s / 1e9 (decimal GB/s); null with no time
-- @column post_share           summed post time / summed transfer time: how much is descriptor posting
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
