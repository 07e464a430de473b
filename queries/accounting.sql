-- accounting: the four byte counts of every NIXL read, and their sums per request.
-- include: _macros, handoffs
--
-- For one read (one decode rank's read from one prefill rank), with B and S the
-- decode engine's per-rank byte model (engine_models), T the request's transferred
-- tokens, J the state blocks read and `share` the number of reads that decode rank makes
-- for the request: one per prefill rank it covers, remote_tp_size / tp_size when the
-- prefill engine has more ranks, else 1 (taken from the read's own TP sizes, so a read
-- missing from the trace does not inflate the others):
--   logical     = (B·T) / share + (S·J) / share                  the information that had to move
--   expected    = (ceil(T / block)·block·B) / share + (S·J) / share    attention blocks move whole
--   reserved    = (ceil(T / block)·block·B) / share + (J·L·padded page) / share   allocator pages
--   transported = what NIXL reported
-- L counts the model's real recurrent layers, as `hybridtrace model` does. The padding
-- layers the hybrid allocator adds to fill its last state group hold pages too, and a
-- connector that sends whole groups sends them: padding_layers_bytes sizes them apart.
-- Divisions are integer (a read moves whole bytes). expected − logical is block rounding
-- (not a leak); transported − expected is what a correct connector would not have moved.

-- _group_bytes(groups, state): a read's bytes of its recurrent-state (mamba) groups, or of
-- every other group (attention), from the groups JSON text; null without groups.
CREATE OR REPLACE MACRO _group_bytes(groups, state) AS
    CASE WHEN len(json_transform(groups, '[{"kind": "VARCHAR", "bytes": "BIGINT"}]')) > 0
         THEN coalesce(list_sum([
             x.bytes FOR x IN json_transform(groups, '[{"kind": "VARCHAR", "bytes": "BIGINT"}]')
             IF (x.kind = 'mamba') = state]), 0) END;

-- _expected_attention_bytes(b, block, tokens, share): attention bytes as whole blocks; a
-- model without attention layers (B = 0, no block size) moves none.
CREATE OR REPLACE MACRO _expected_attention_bytes(b, block, tokens, share) AS
    CASE WHEN b = 0 OR block IS NULL THEN 0 ELSE (tokens + block - 1) // block * block * b // share END;

-- _reserved_state_bytes(padded_state, s, state_blocks, share): state as allocator pages.
CREATE OR REPLACE MACRO _reserved_state_bytes(padded_state, s, state_blocks, share) AS
    coalesce(padded_state, s) * state_blocks // share;

-- _modelled(relation): the rows of `relation` (a relation named as text, with the columns of
-- requests) whose decode engine has a sized byte model, beside the columns _request_model
-- gives (state_blocks replaced by its default), and the engine's TP size (model_tp_size).
CREATE OR REPLACE MACRO _modelled(relation) AS TABLE
SELECT r.* REPLACE (coalesce(r.state_blocks, 1) AS state_blocks),
       r.transferred_tokens AS tokens,
       m.attention_bytes_per_token AS b,
       m.state_bytes AS s,
       m.block_tokens AS block,
       m.mamba_padded_page_bytes * m.recurrent_layers AS padded_state,
       m.mamba_padded_page_bytes * coalesce(m.padding_layers, 0) AS padding_layer_state,
       r.status AS request_status,
       m.tp_size AS model_tp_size
FROM query_table(relation) r
JOIN engine_models m ON m.engine_id = r.engine_id AND m.error IS NULL;

-- _request_model: what sizing a request's reads needs — its tokens and state blocks, and
-- its decode engine's per-rank byte model — for requests of an engine with a sized model.
--
-- Columns:
--   engine_id, request_id              the request
--   tokens (T), state_blocks (J)       transferred tokens, state blocks read (default 1)
--   b, s, block                        bytes per token, state bytes, block tokens (per rank)
--   padded_state                       one state block as the allocator pages it, all layers
--   padding_layer_state                the padding layers' pages of one state block
--   request_status                     the request record's status
CREATE OR REPLACE VIEW _request_model AS
SELECT engine_id, request_id, tokens, state_blocks, b, s, block, padded_state, padding_layer_state, request_status
FROM _modelled('requests');

-- _sized_reads(model): transfer_bytes over the requests of `model` (a relation named as text,
-- with the columns of _request_model): the reads of those requests only, each sized.
CREATE OR REPLACE MACRO _sized_reads(model) AS TABLE
WITH base AS (
    SELECT
        t.engine_id, t.request_id, t.rank, t.remote_engine_id, t.remote_rank, t.ts, t.status,
        q.tokens, q.state_blocks, _share(t.tp_size, t.remote_tp_size) AS share,
        q.b, q.s, q.block, q.padded_state, q.padding_layer_state,
        t.transported_bytes, t.staging_bytes,
        t.attention_transported_bytes AS attention_group_bytes,
        t.state_transported_bytes AS state_group_bytes,
        t.groups
    FROM transfers t
    JOIN query_table(model) q USING (engine_id, request_id)
),
counted AS (
    SELECT
        *,
        b * tokens // share AS logical_attention_bytes,
        s * state_blocks // share AS logical_state_bytes,
        _expected_attention_bytes(b, block, tokens, share) AS expected_attention_bytes,
        _reserved_state_bytes(padded_state, s, state_blocks, share) AS reserved_state_bytes,
        coalesce(padding_layer_state, 0) * state_blocks // share AS padding_layers_bytes,
        -- ingest sums the groups by cache type; stores written before it did are summed here
        CASE WHEN attention_group_bytes IS NOT NULL OR groups IS NULL THEN attention_group_bytes
             ELSE _group_bytes(groups, false) END AS attention_transported_bytes,
        CASE WHEN state_group_bytes IS NOT NULL OR groups IS NULL THEN state_group_bytes
             ELSE _group_bytes(groups, true) END AS state_transported_bytes
    FROM base
)
SELECT
    engine_id, request_id, rank, remote_engine_id, remote_rank, ts, status,
    tokens AS transferred_tokens, state_blocks, share,
    logical_attention_bytes + logical_state_bytes AS logical_bytes,
    expected_attention_bytes + logical_state_bytes AS expected_bytes,
    expected_attention_bytes + reserved_state_bytes AS reserved_bytes,
    transported_bytes,
    logical_attention_bytes, logical_state_bytes,
    expected_attention_bytes, logical_state_bytes AS expected_state_bytes,
    reserved_state_bytes,
    attention_transported_bytes, state_transported_bytes,
    expected_attention_bytes - logical_attention_bytes AS block_rounding_bytes,
    transported_bytes - (expected_attention_bytes + logical_state_bytes) AS excess_bytes,
    reserved_state_bytes - logical_state_bytes AS padding_gap_bytes,
    padding_layers_bytes,
    staging_bytes
FROM counted;

-- transfer_bytes: one row per read with a sized engine and a matching request.
--
-- @column engine_id                    decode engine
-- @column request_id                   decode-side request id
-- @column rank                         decode TP rank that read
-- @column remote_engine_id             prefill engine read from
-- @column remote_rank                  prefill TP rank read from
-- @column ts                           when the read completed (epoch s)
-- @column status                       'ok', 'failed' or 'expired'
-- @column transferred_tokens           T: the request's transferred tokens
-- @column state_blocks                 J: state blocks read (1 when the request does not say)
-- @column share                        reads the decode rank makes of the request
-- @column logical_bytes                the information that had to move
-- @column expected_bytes               what a correct connector moves (attention as whole blocks)
-- @column reserved_bytes               what the allocator holds (state as padded pages)
-- @column transported_bytes            what NIXL reported
-- @column logical_attention_bytes      logical bytes of attention
-- @column logical_state_bytes          logical bytes of recurrent state
-- @column expected_attention_bytes     expected bytes of attention
-- @column expected_state_bytes         expected bytes of recurrent state (= logical)
-- @column reserved_state_bytes         the state as padded pages
-- @column attention_transported_bytes  the read's bytes of attention groups; null without groups
-- @column state_transported_bytes      the read's bytes of state (mamba) groups; null without groups
-- @column block_rounding_bytes         expected − logical
-- @column excess_bytes                 transported − expected (positive: more than a correct connector moves)
-- @column padding_gap_bytes            reserved − expected: what sending padded state pages would add
-- @column padding_layers_bytes         the padding layers' state pages: what sending them as well would add
-- @column staging_bytes                host-buffer copies the connector reported beside the read (0 if none)
CREATE OR REPLACE VIEW transfer_bytes AS SELECT * FROM _sized_reads('_request_model');

-- _sized_requests: each request's reads grouped once (_request_reads) beside its byte model
-- (_request_model): for a request whose reads all make one share, the four counts of each
-- of its reads (they are equal), else null.
--
-- Columns:
--   engine_id, request_id                      the request
--   tokens, state_blocks, b, s, block,
--   padded_state, padding_layer_state,
--   request_status                             its byte model and record status, as _request_model has them
--   share, shares_agree                        reads per decode rank, and whether every read makes it
--   reads, reads_ok                            its reads, the successful ones
--   transported_bytes, max_ok_bytes            bytes of its successful reads, summed and the largest
--   max_staging_bytes                          the most bytes one of its reads staged through host memory
--   logical, expected, reserved                one read's counts (shares_agree only)
CREATE OR REPLACE VIEW _sized_requests AS
SELECT q.engine_id, q.request_id, q.tokens, q.state_blocks, q.b, q.s, q.block, q.padded_state,
       q.padding_layer_state, q.request_status,
       q.share, q.shares_agree, q.reads, q.reads_ok, q.aggregate_bytes AS transported_bytes, q.max_ok_bytes,
       q.max_staging_bytes,
       CASE WHEN q.shares_agree THEN q.b * q.tokens // q.share + q.s * q.state_blocks // q.share END AS logical,
       CASE WHEN q.shares_agree
            THEN _expected_attention_bytes(q.b, q.block, q.tokens, q.share) + q.s * q.state_blocks // q.share
       END AS expected,
       CASE WHEN q.shares_agree
            THEN _expected_attention_bytes(q.b, q.block, q.tokens, q.share)
                 + _reserved_state_bytes(q.padded_state, q.s, q.state_blocks, q.share)
       END AS reserved
FROM _modelled('_request_rows') q
WHERE q.has_reads;

-- _excess_request_model: the requests that can hold a read with excess bytes, with their byte
-- model: the largest successful read exceeds one read's expected bytes by more than the
-- excess_min_bytes threshold, or the reads make different shares (sized read by read).
CREATE OR REPLACE VIEW _excess_request_model AS
SELECT engine_id, request_id, tokens, state_blocks, b, s, block, padded_state, padding_layer_state, request_status
FROM _sized_requests
WHERE NOT shares_agree OR max_ok_bytes - expected > _t('excess_min_bytes');

-- _excess_reads: the successful reads that moved more than a correct connector would
-- (by more than the excess_min_bytes threshold): all the padding and unsharded-state
-- rules look at, computed once per analysis instead of materialising every read. Only the
-- reads of _excess_request_model's requests are sized, and only the columns those rules read
-- are kept (the analysis holds these rows in memory: half a million reads on a million requests).
--
-- Columns:
--   engine_id, request_id, rank, remote_engine_id     the read
--   share, transported_bytes, staging_bytes,
--   expected_bytes, reserved_bytes, excess_bytes,
--   padding_gap_bytes, padding_layers_bytes,
--   expected_attention_bytes, expected_state_bytes,
--   state_transported_bytes                           as transfer_bytes has them
CREATE OR REPLACE VIEW _excess_reads AS
SELECT engine_id, request_id, rank, remote_engine_id, share, transported_bytes, staging_bytes, expected_bytes,
       reserved_bytes, excess_bytes, padding_gap_bytes, padding_layers_bytes, expected_attention_bytes,
       expected_state_bytes, state_transported_bytes
FROM _sized_reads('_excess_request_model') WHERE status = 'ok' AND excess_bytes > _t('excess_min_bytes');

-- _mixed_share_model: the requests whose reads make different shares (reads with other TP
-- sizes), with their byte model: summed read by read.
CREATE OR REPLACE VIEW _mixed_share_model AS
SELECT engine_id, request_id, tokens, state_blocks, b, s, block, padded_state, padding_layer_state
FROM _sized_requests WHERE NOT shares_agree;

-- _accounting_totals: one row: the sums of transfer_bytes, from each request's reads grouped
-- once (_sized_requests) rather than from every read joined to its request. The reads of a
-- request that all make the same share have the same four counts, so each sum is the count of
-- its successful reads times them; a request whose reads make different shares is summed
-- read by read.
--
-- Columns:
--   reads, reads_ok                     reads accounted (sized engine, request record), successful ones
--   reads_sized                         successful reads with byte counts (their request gives T)
--   logical_bytes, expected_bytes,
--   reserved_bytes, transported_bytes   the four counts summed over the successful reads
--   sized_transported_bytes             transported, over the reads the model could size (a
--                                       request without transferred_tokens has no counts):
--                                       ratios to the other sums use this one
CREATE OR REPLACE VIEW _accounting_totals AS
WITH per_share AS (
    SELECT reads, reads_ok, transported_bytes, logical, expected, reserved
    FROM _sized_requests WHERE shares_agree
    UNION ALL
    -- a request whose reads make different shares: read by read
    SELECT 1, CAST(status = 'ok' AS INTEGER), CASE WHEN status = 'ok' THEN transported_bytes END,
           logical_bytes, expected_bytes, reserved_bytes
    FROM _sized_reads('_mixed_share_model')
),
sized AS (
    -- no successful read: no sum (null, as a sum over no read is)
    SELECT *, CASE WHEN reads_ok > 0 THEN reads_ok END AS n FROM per_share
)
SELECT
    CAST(coalesce(sum(reads), 0) AS BIGINT) AS reads,
    CAST(coalesce(sum(reads_ok), 0) AS BIGINT) AS reads_ok,
    CAST(coalesce(sum(reads_ok) FILTER (WHERE expected IS NOT NULL), 0) AS BIGINT) AS reads_sized,
    sum(n * logical) AS logical_bytes,
    sum(n * expected) AS expected_bytes,
    sum(n * reserved) AS reserved_bytes,
    sum(transported_bytes) AS transported_bytes,
    sum(transported_bytes) FILTER (WHERE expected IS NOT NULL) AS sized_transported_bytes
FROM sized;

-- _log_event_counts: one row: the log events' count and the records the trace writers said
-- they dropped, as _input_counts and _input_counts_of_rows give them.
--
-- Columns:
--   log_events              rows of log_events
--   trace_records_dropped   records the trace writers said they dropped (`trace_dropped` events)
CREATE OR REPLACE VIEW _log_event_counts AS
SELECT count(*) AS log_events,
       CAST(coalesce(sum(TRY_CAST(json_extract(details, '$.records') AS BIGINT))
                     FILTER (WHERE kind = 'trace_dropped'), 0) AS BIGINT) AS trace_records_dropped
FROM log_events;

-- _input_counts: one row: how many rows of the request-scoped inputs there are, as the
-- summary's input counts and the request rules' inputs give them. Each is a scan that grows
-- with the store: an incremental analysis reads them from its state's counters instead
-- (analyze/incremental.py keeps them per request id).
--
-- Columns:
--   transfers               rows of transfers (reads)
--   transfers_ok            those whose status is 'ok'
--   requests                rows of requests
--   requests_with_tokens    those that say how many tokens crossed (transferred_tokens)
--   log_events              rows of log_events
--   trace_records_dropped   records the trace writers said they dropped (`trace_dropped` events)
CREATE OR REPLACE VIEW _input_counts AS
SELECT t.transfers, t.transfers_ok, r.requests, r.requests_with_tokens, e.log_events, e.trace_records_dropped
FROM (SELECT count(*) AS transfers, count(*) FILTER (WHERE status = 'ok') AS transfers_ok FROM transfers) t,
     (SELECT count(*) AS requests, count(transferred_tokens) AS requests_with_tokens FROM requests) r,
     _log_event_counts e;

-- _input_counts_of_rows: _input_counts from the request tables an analysis holds: the reads
-- counted from each request's reads grouped once (_request_reads groups every read, those
-- naming no request too), the records from _request_rows (one row per request record). The
-- analysis computes _input_counts from these instead of scanning every read and record again.
--
-- Columns:
--   transfers, transfers_ok, requests,
--   requests_with_tokens, log_events,
--   trace_records_dropped                  as _input_counts has them
CREATE OR REPLACE VIEW _input_counts_of_rows AS
SELECT t.transfers, t.transfers_ok, r.requests, r.requests_with_tokens, e.log_events, e.trace_records_dropped
FROM (SELECT CAST(coalesce(sum(reads), 0) AS BIGINT) AS transfers,
             CAST(coalesce(sum(reads_ok), 0) AS BIGINT) AS transfers_ok FROM _request_reads) t,
     (SELECT count(*) AS requests, count(transferred_tokens) AS requests_with_tokens FROM _request_rows) r,
     _log_event_counts e;

-- request_bytes: the four counts summed over a request's successful reads (all ranks): a
-- failed or expired read moved nothing it had to, so it counts in `reads` only.
--
-- Ratios are ratios of sums over the request's reads, not means of per-read ratios.
--
-- @column engine_id                  decode engine
-- @column request_id                 decode-side request id
-- @column reads                      all its reads, whatever their status
-- @column ranks                      distinct decode ranks that read
-- @column logical_bytes              summed over the successful reads
-- @column expected_bytes             summed over the successful reads
-- @column reserved_bytes             summed over the successful reads
-- @column transported_bytes          summed over the successful reads
-- @column transported_over_expected  transported / expected (ratio of the sums)
-- @column transported_over_logical   transported / logical (ratio of the sums)
-- @column excess_bytes               transported − expected over the successful reads
CREATE OR REPLACE VIEW request_bytes AS
SELECT
    engine_id, request_id,
    count(*) AS reads,
    _rank_count(rank) AS ranks,
    sum(logical_bytes) FILTER (WHERE status = 'ok') AS logical_bytes,
    sum(expected_bytes) FILTER (WHERE status = 'ok') AS expected_bytes,
    sum(reserved_bytes) FILTER (WHERE status = 'ok') AS reserved_bytes,
    sum(transported_bytes) FILTER (WHERE status = 'ok') AS transported_bytes,
    sum(transported_bytes) FILTER (WHERE status = 'ok')
        / nullif(sum(expected_bytes) FILTER (WHERE status = 'ok'), 0) AS transported_over_expected,
    sum(transported_bytes) FILTER (WHERE status = 'ok')
        / nullif(sum(logical_bytes) FILTER (WHERE status = 'ok'), 0) AS transported_over_logical,
    sum(excess_bytes) FILTER (WHERE status = 'ok') AS excess_bytes
FROM transfer_bytes
GROUP BY ALL;
