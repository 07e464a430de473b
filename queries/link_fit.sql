-- link_fit: the link model fitted from what the reads did (time = fixed + bytes / bandwidth +
-- descriptors × per-descriptor cost), per decode rank, engine pair, named link and fleet-wide.
-- include:
--
-- The fits are made in Python (hybridtrace.analyze.link_fit: a median regression, so a slow
-- tail does not move them) when the store is opened for analysis, and kept in _link_fits;
-- the rules and the report read them here.

CREATE OR REPLACE TABLE _link_fits (
    scope VARCHAR, engine_id VARCHAR, remote_engine_id VARCHAR, rank INTEGER, link VARCHAR, source VARCHAR,
    reads BIGINT, transfers_used BIGINT, fixed_s DOUBLE, bandwidth_bytes_per_s DOUBLE, per_descriptor_s DOUBLE,
    bytes_per_descriptor DOUBLE, median_error_pct DOUBLE, note VARCHAR
);

-- link_fits: one fitted link per scope and group. A group needs 8 successful timed reads.
-- The connector trace's reads are fitted when the store has any, else NIXL's own ring
-- transfers (which name no peer and no route, and carry no descriptor count).
--
-- @column scope                  'rank' (a decode rank of a pair over one route), 'pair' (all ranks of a
--                                pair), 'link' (every read over a named route), 'fleet' (every read), or
--                                'nixlbench' (a link's nixlbench calibration points; link = its folder)
-- @column engine_id              decode engine (rank and pair scopes; for rings, the agent's engine)
-- @column remote_engine_id       prefill engine (rank and pair scopes; null for rings: they name no peer)
-- @column rank                   decode TP rank (rank scope)
-- @column link                   the route (rank scope: null when the trace names none; link scope)
-- @column source                 'trace' (the connector's reads), 'nixl' (NIXL's ring transfers) or
--                                'nixlbench' (one point per nixlbench row: an average request)
-- @column reads                  successful timed reads of the group
-- @column transfers_used         reads the fit used: all of them, or a seeded sample of 20,000 of more
-- @column fixed_s                fitted fixed cost of one read, seconds (polling delay included)
-- @column bandwidth_bytes_per_s  fitted effective bandwidth, bytes/s; null when bytes did not explain time
-- @column per_descriptor_s       fitted cost of one descriptor, seconds; null when descriptors could not
--                                be told apart from bytes (then their cost is in the bandwidth)
-- @column bytes_per_descriptor   bytes over descriptors of the reads used (ratio of sums); null for rings
-- @column median_error_pct       quality: the median of |fitted − measured| / measured over the reads, %
-- @column note                   why a term is missing, when one is
CREATE OR REPLACE VIEW link_fits AS SELECT * FROM _link_fits;

-- rank_link_fits: each rank fit beside its peers': the median fitted bandwidth of the other
-- ranks of the same engine pair over the same route.
--
-- @column engine_id                   decode engine
-- @column remote_engine_id            prefill engine (null for ring fits)
-- @column link                        the route (null when not named)
-- @column rank                        decode TP rank
-- @column transfers_used              reads its fit used
-- @column bandwidth_bytes_per_s       its fitted bandwidth, bytes/s
-- @column peer_bandwidth_bytes_per_s  median fitted bandwidth of its peers; null with no fitted peer
-- @column bandwidth_ratio             its bandwidth over the peers' median
CREATE OR REPLACE VIEW rank_link_fits AS
WITH ranks AS (SELECT * FROM link_fits WHERE scope = 'rank')
SELECT a.engine_id, a.remote_engine_id, a.link, a.rank, a.transfers_used, a.bandwidth_bytes_per_s,
       p.peer_bandwidth_bytes_per_s,
       a.bandwidth_bytes_per_s / nullif(p.peer_bandwidth_bytes_per_s, 0) AS bandwidth_ratio
FROM ranks a
LEFT JOIN LATERAL (
    SELECT median(b.bandwidth_bytes_per_s) AS peer_bandwidth_bytes_per_s FROM ranks b
    WHERE b.engine_id = a.engine_id AND b.remote_engine_id IS NOT DISTINCT FROM a.remote_engine_id
      AND b.link IS NOT DISTINCT FROM a.link AND b.rank <> a.rank
) p ON true;
