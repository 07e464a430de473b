-- nixl: NIXL's own telemetry beside the engines and ranks its agents belong to: transfers from
-- its telemetry rings (nixl_transfer_ranks) and its Prometheus exporters' counters per agent
-- and scrape interval (nixl_agent_intervals).
-- include: intervals

-- _nixl_agents: which engine and TP rank each known NIXL agent belongs to. The connector's
-- engine records (engines.agent_name) say it as measured; a user's agent map (agent_map,
-- docs/ingest.md "Agent maps") names the agents no record does. Of several records or map
-- entries for one agent, the newest wins.
CREATE OR REPLACE VIEW _nixl_agents AS
WITH recorded AS (
    SELECT agent_name, arg_max(engine_id, coalesce(ts, 0)) AS engine_id, arg_max(rank, coalesce(ts, 0)) AS rank
    FROM engines WHERE agent_name IS NOT NULL GROUP BY agent_name
),
given AS (
    SELECT agent_name, arg_max(engine_id, ingested_at) AS engine_id, arg_max(rank, ingested_at) AS rank
    FROM agent_map GROUP BY agent_name
)
SELECT agent_name, engine_id, rank, 'engine_record' AS mapped_by FROM recorded
UNION ALL
SELECT agent_name, engine_id, rank, 'agent_map' AS mapped_by FROM given
WHERE agent_name NOT IN (SELECT agent_name FROM recorded);

-- nixl_transfer_ranks: NIXL's own transfers (from its telemetry rings) beside the engine and
-- rank whose NIXL agent posted them.
--
-- A ring is named after its agent, and vLLM names agents with random UUIDs; the connector's
-- engine records carry each process's agent name (engines.agent_name), which is what maps a
-- ring to an engine and TP rank. An agent no engine record names stays visible, unmapped.
--
-- @column agent               NIXL agent name (the ring file's name)
-- @column engine_id           engine whose process owns the agent; null when no record names it
-- @column rank                that process's TP rank; null when unmapped
-- @column mapped              true when an engine record or the agent map names the agent
-- @column mapped_by           engine_record (the connector's) or agent_map (the user's); null when unmapped
-- @column direction           read (the agent pulled) or write
-- @column post_us             NIXL's post time, µs
-- @column xfer_us             NIXL's transfer time (post start to observed completion), µs
-- @column transported_bytes   bytes of the transfer
-- @column effective_gb_s      transported_bytes / xfer_us / 1e3 (decimal GB/s); null with no time
-- @column seq                 the transfer's place in its ring snapshot
-- @column snapshot_id         the read of the ring it was first seen in
CREATE OR REPLACE VIEW nixl_transfer_ranks AS
WITH agents AS (SELECT * FROM _nixl_agents)
SELECT
    n.agent,
    a.engine_id,
    a.rank,
    a.agent_name IS NOT NULL AS mapped,
    a.mapped_by,
    n.direction,
    n.post_us,
    n.xfer_us,
    n.transported_bytes,
    n.transported_bytes / nullif(n.xfer_us, 0) / 1e3 AS effective_gb_s,
    n.seq,
    n.snapshot_id
FROM nixl_transfers n
LEFT JOIN agents a ON a.agent_name = n.agent;

-- nixl_agent_intervals: what each NIXL agent's own counters grew by between two scrapes.
--
-- NIXL's Prometheus exporters (`prometheus`, `prometheus_mp`, `doca`) label every series with
-- the agent (`agent_name`, `hostname`; `prometheus_mp` adds `pid`, `agent_instance` and the
-- process's `local_rank`), so their scrapes are per agent, that is per process and TP rank,
-- where vLLM's own statistics pool the ranks. One row per agent and scrape after its first,
-- from prom_deltas (a counter reset counts from zero). The agent maps to its engine and rank
-- through the connector's engine records (engines.agent_name), as rings do; an agent no
-- record names stays unmapped, with the exporter's `local_rank` as the only hint.
-- `agent_xfer_time_total` and the histogram's `_sum` are the same microseconds; either
-- serves. Reads and writes share the time counters, so a bandwidth is only meaningful for an
-- agent that moved bytes one way in the interval (`one_way`).
--
-- @column instance            path of the folder the scrapes were found in
-- @column target              the scraped server of a federated scrape; empty otherwise
-- @column agent_name          NIXL agent name
-- @column hostname            the exporter's hostname label
-- @column pid                 process id (prometheus_mp); null otherwise
-- @column agent_instance      agent counter within its process (prometheus_mp); null otherwise
-- @column local_rank          the exporter's local_rank label (prometheus_mp); null otherwise
-- @column engine_id           engine whose process owns the agent; null when no engine record names it
-- @column rank                that process's TP rank (from the engine record); null when unmapped
-- @column mapped              true when an engine record or the agent map names the agent
-- @column mapped_by           engine_record or agent_map; null when unmapped
-- @column start_ts            the scrape before, epoch s
-- @column end_ts              this scrape, epoch s
-- @column rx_bytes            bytes the agent received (its READs pulled, WRITEs into it)
-- @column tx_bytes            bytes it sent
-- @column rx_requests         transfer requests it received
-- @column tx_requests         transfer requests it sent
-- @column transfers           transfers it timed (the transfer-time histogram's count)
-- @column xfer_us             summed transfer time, µs
-- @column post_us             summed post time, µs
-- @column avg_xfer_s          mean transfer time, s (ratio of sums)
-- @column avg_post_s          mean post time, s (ratio of sums)
-- @column errors              failed operations (agent_errors_total, every status)
-- @column events_dropped      telemetry events NIXL dropped (its queue was full)
-- @column one_way             true when the agent moved bytes one way only
-- @column bandwidth_bytes_s   moved bytes over summed transfer time, bytes/s (one-way intervals only)
CREATE OR REPLACE VIEW nixl_agent_intervals AS
WITH series AS (
    SELECT instance, target, ts, prev_ts, metric, delta,
           json_extract_string(labels, '$.agent_name') AS agent_name,
           json_extract_string(labels, '$.hostname') AS hostname,
           TRY_CAST(json_extract_string(labels, '$.pid') AS BIGINT) AS pid,
           TRY_CAST(json_extract_string(labels, '$.agent_instance') AS BIGINT) AS agent_instance,
           json_extract_string(labels, '$.local_rank') AS local_rank
    FROM prom_deltas
    WHERE metric LIKE 'agent\_%' ESCAPE '\' AND le IS NULL
),
per_scrape AS (
    SELECT instance, target, agent_name, hostname, pid, agent_instance, local_rank, ts,
           min(prev_ts) AS prev_ts,
           sum(delta) FILTER (WHERE metric = 'agent_rx_bytes_total') AS rx_bytes,
           sum(delta) FILTER (WHERE metric = 'agent_tx_bytes_total') AS tx_bytes,
           sum(delta) FILTER (WHERE metric = 'agent_rx_requests_num_total') AS rx_requests,
           sum(delta) FILTER (WHERE metric = 'agent_tx_requests_num_total') AS tx_requests,
           sum(delta) FILTER (WHERE metric = 'agent_xfer_time_us_count') AS transfers,
           coalesce(sum(delta) FILTER (WHERE metric = 'agent_xfer_time_us_sum'),
                    sum(delta) FILTER (WHERE metric = 'agent_xfer_time_total')) AS xfer_us,
           coalesce(sum(delta) FILTER (WHERE metric = 'agent_xfer_post_time_us_sum'),
                    sum(delta) FILTER (WHERE metric = 'agent_xfer_post_time_total')) AS post_us,
           sum(delta) FILTER (WHERE metric = 'agent_errors_total') AS errors,
           sum(delta) FILTER (WHERE metric = 'agent_telemetry_events_dropped_total') AS events_dropped
    FROM series
    WHERE agent_name IS NOT NULL
    GROUP BY ALL
),
agents AS (SELECT * FROM _nixl_agents)
SELECT p.instance, p.target, p.agent_name, p.hostname, p.pid, p.agent_instance, p.local_rank,
       a.engine_id, a.rank, a.agent_name IS NOT NULL AS mapped, a.mapped_by,
       p.prev_ts AS start_ts, p.ts AS end_ts,
       CAST(p.rx_bytes AS BIGINT) AS rx_bytes, CAST(p.tx_bytes AS BIGINT) AS tx_bytes,
       CAST(p.rx_requests AS BIGINT) AS rx_requests, CAST(p.tx_requests AS BIGINT) AS tx_requests,
       CAST(p.transfers AS BIGINT) AS transfers,
       p.xfer_us, p.post_us,
       p.xfer_us / 1e6 / nullif(p.transfers, 0) AS avg_xfer_s,
       p.post_us / 1e6 / nullif(p.transfers, 0) AS avg_post_s,
       CAST(p.errors AS BIGINT) AS errors, CAST(p.events_dropped AS BIGINT) AS events_dropped,
       (coalesce(p.rx_bytes, 0) = 0) <> (coalesce(p.tx_bytes, 0) = 0) AS one_way,
       CASE WHEN (coalesce(p.rx_bytes, 0) = 0) <> (coalesce(p.tx_bytes, 0) = 0)
            THEN (coalesce(p.rx_bytes, 0) + coalesce(p.tx_bytes, 0)) / nullif(p.xfer_us / 1e6, 0)
       END AS bandwidth_bytes_s
FROM per_scrape p
LEFT JOIN agents a ON a.agent_name = p.agent_name;
