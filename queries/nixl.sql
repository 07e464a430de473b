-- nixl_transfer_ranks: NIXL's own transfers (from its telemetry rings) beside the engine and
-- rank whose NIXL agent posted them.
-- include:
--
-- A ring is named after its agent, and vLLM names agents with random UUIDs; the connector's
-- engine records carry each process's agent name (engines.agent_name), which is what maps a
-- ring to an engine and TP rank. An agent no engine record names stays visible, unmapped.
--
-- @column agent               NIXL agent name (the ring file's name)
-- @column engine_id           engine whose process owns the agent; null when no record names it
-- @column rank                that process's TP rank; null when unmapped
-- @column mapped              true when an engine record names the agent
-- @column direction           read (the agent pulled) or write
-- @column post_us             NIXL's post time, µs
-- @column xfer_us             NIXL's transfer time (post start to observed completion), µs
-- @column transported_bytes   bytes of the transfer
-- @column effective_gb_s      transported_bytes / xfer_us / 1e3 (decimal GB/s); null with no time
-- @column seq                 the transfer's place in its ring snapshot
-- @column snapshot_id         the read of the ring it was first seen in
CREATE OR REPLACE VIEW nixl_transfer_ranks AS
WITH agents AS (
    SELECT agent_name, arg_max(engine_id, coalesce(ts, 0)) AS engine_id, arg_max(rank, coalesce(ts, 0)) AS rank
    FROM engines WHERE agent_name IS NOT NULL GROUP BY agent_name
)
SELECT
    n.agent,
    a.engine_id,
    a.rank,
    a.agent_name IS NOT NULL AS mapped,
    n.direction,
    n.post_us,
    n.xfer_us,
    n.transported_bytes,
    n.transported_bytes / nullif(n.xfer_us, 0) / 1e3 AS effective_gb_s,
    n.seq,
    n.snapshot_id
FROM nixl_transfers n
LEFT JOIN agents a ON a.agent_name = n.agent;
