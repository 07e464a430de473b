-- findings_other_engines: TensorRT-LLM's and SGLang's own byte counts held against the byte model.
-- include: _macros
--
-- These engines report per request and rank the bytes they sent (docs/other-engines.md).
-- B·T + S·J is what those bytes had to be at least, a property of the model; whole
-- attention blocks and the report's own rounding are all a correct count may add. The
-- vLLM accounting (transfer_bytes and the views over it) leaves its expected and reserved
-- counts null for these rows: they size vLLM's allocator, which these engines do not run.

-- _other_engines: the engines whose records come from TensorRT-LLM's or SGLang's files.
CREATE OR REPLACE VIEW _other_engines AS
SELECT engine_id, min(source_kind) AS source_kind
FROM engines
WHERE source_kind IN ('trtllm', 'sglang')
GROUP BY engine_id;

-- reported_bytes: per request and sending rank of a TensorRT-LLM or SGLang engine, the bytes
-- the engine reported against what its tokens and state explain.
--
-- A rank's send rows of one request are summed: TensorRT-LLM writes one per peer rank, each
-- carrying that peer's part of the rank's share; SGLang one per request. T is the request's
-- transferred tokens when known, else its prompt (SGLang's prefill sends the prompt's KV);
-- J is its state snapshots, 1 when not said (one state slot per request). B, S and the
-- block are the engine's per-rank byte model (engine_models), as the rows are per rank.
-- A row the model cannot size keeps its reported bytes and says why in `unsized`.
--
-- @column engine_id              the sending engine
-- @column source_kind            'trtllm' or 'sglang'
-- @column request_id             the request, as the engine names it
-- @column rank                   the sending rank (TensorRT-LLM's instance rank, SGLang's TP rank)
-- @column start_ts               first of its rows' times (epoch s); null when the file has none
-- @column end_ts                 last of its rows' times (epoch s)
-- @column send_rows              send rows summed (one per peer rank for TensorRT-LLM)
-- @column peers                  distinct peer ranks the rows name (0: the source names none)
-- @column transported_bytes      the bytes the engine reported, summed over the rows
-- @column reported_bytes_per_s   the highest rate the rows report, bytes/s
-- @column tokens                 T: transferred tokens, else the prompt's
-- @column state_snapshots        J: state snapshots (1 when the request does not say)
-- @column logical_bytes          B·T + S·J
-- @column block_rounding_bytes   attention as whole blocks of the byte model, less B·T
-- @column expected_bytes         logical + block rounding
-- @column report_rounding_bytes  what the report's printing can add (5,243 for SGLang's 2-decimal MiB; 0 else)
-- @column allowed_bytes          expected + report rounding: the most a correct count reaches
-- @column excess_bytes           transported − expected
-- @column unsized                why the byte model cannot judge the row; null when it can
CREATE OR REPLACE VIEW reported_bytes AS
WITH sent AS (
    SELECT t.engine_id, o.source_kind, t.request_id, t.rank,
           min(t.ts) AS start_ts, max(t.ts) AS end_ts,
           count(*) AS send_rows, count(DISTINCT t.remote_rank) AS peers,
           sum(t.transported_bytes) AS transported_bytes,
           max(t.reported_bytes_per_s) AS reported_bytes_per_s
    FROM transfers t
    JOIN _other_engines o USING (engine_id)
    WHERE t.side = 'send' AND t.transported_bytes IS NOT NULL AND coalesce(t.status, 'ok') = 'ok'
    GROUP BY ALL
),
sized AS (
    SELECT s.*,
           coalesce(r.transferred_tokens, r.prompt_tokens) AS tokens,
           coalesce(r.state_blocks, 1) AS state_snapshots,
           m.attention_bytes_per_token AS b, m.state_bytes AS s_bytes, m.block_tokens AS block,
           CASE WHEN m.engine_id IS NULL THEN 'no model config serves the engine'
                WHEN m.error IS NOT NULL THEN 'byte model: ' || m.error
                WHEN r.request_id IS NULL THEN 'no request record of the engine names the request'
                WHEN coalesce(r.transferred_tokens, r.prompt_tokens) IS NULL
                    THEN 'the request record gives no token count' END AS unsized
    FROM sent s
    LEFT JOIN requests r ON r.engine_id = s.engine_id AND r.request_id = s.request_id
    LEFT JOIN engine_models m ON m.engine_id = s.engine_id
),
counted AS (
    SELECT *,
           CASE WHEN unsized IS NULL THEN b * tokens + s_bytes * state_snapshots END AS logical_bytes,
           -- as accounting.sql rounds: a model without attention layers (B = 0) moves no blocks
           CASE WHEN unsized IS NULL THEN
                CASE WHEN b = 0 OR block IS NULL THEN 0 ELSE (tokens + block - 1) // block * block * b - b * tokens END
           END AS block_rounding_bytes,
           CASE WHEN source_kind = 'sglang' THEN 5243 ELSE 0 END AS report_rounding_bytes
    FROM sized
)
SELECT engine_id, source_kind, request_id, rank, start_ts, end_ts, send_rows, peers,
       transported_bytes, reported_bytes_per_s, tokens, state_snapshots,
       logical_bytes, block_rounding_bytes,
       logical_bytes + block_rounding_bytes AS expected_bytes,
       report_rounding_bytes,
       logical_bytes + block_rounding_bytes + report_rounding_bytes AS allowed_bytes,
       transported_bytes - (logical_bytes + block_rounding_bytes) AS excess_bytes,
       unsized
FROM counted;

-- finding_reported_bytes_excess: a TensorRT-LLM or SGLang rank reported sending more bytes
-- for a request than its tokens and state explain, beyond block and report rounding; the
-- reported speed is named beside it when it is above the link's rate (link_bytes_per_s).
CREATE OR REPLACE VIEW finding_reported_bytes_excess AS
SELECT
    'reported_bytes_excess' AS kind, 'warning' AS severity, engine_id, rank, request_id,
    CAST(NULL AS VARCHAR) AS remote_engine_id, CAST(NULL AS DOUBLE) AS start_ts, CAST(NULL AS DOUBLE) AS end_ts,
    source_kind || ' engine ' || engine_id || ' rank ' || rank || ' reported ' || transported_bytes
        || ' B for request ' || request_id || ': ' || excess_bytes || ' B more than its ' || tokens
        || ' tokens and ' || state_snapshots || ' state snapshot(s) explain (' || expected_bytes
        || ' B with whole blocks)'
        || CASE WHEN reported_bytes_per_s > _t('link_bytes_per_s')
                THEN ', at a reported ' || round(reported_bytes_per_s / 1e9, 1) || ' GB/s, above the link''s '
                     || round(_t('link_bytes_per_s') / 1e9, 1) || ' GB/s'
                ELSE '' END AS message,
    CAST(json_object('engine_id', engine_id, 'source_kind', source_kind,
        'transported_bytes', transported_bytes, 'logical_bytes', logical_bytes,
        'expected_bytes', expected_bytes, 'block_rounding_bytes', block_rounding_bytes,
        'report_rounding_bytes', report_rounding_bytes, 'excess_bytes', excess_bytes,
        'tokens', tokens, 'state_snapshots', state_snapshots, 'send_rows', send_rows,
        'reported_bytes_per_s',
            CASE WHEN reported_bytes_per_s > _t('link_bytes_per_s') THEN reported_bytes_per_s END,
        'link_bytes_per_s',
            CASE WHEN reported_bytes_per_s > _t('link_bytes_per_s') THEN _t('link_bytes_per_s') END)
        AS VARCHAR) AS evidence
FROM reported_bytes
WHERE unsized IS NULL AND transported_bytes > allowed_bytes;
