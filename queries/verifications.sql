-- verifications: `hybridtrace verify` results beside the handoffs they exercised.
-- include: findings_requests
--
-- A verification is keyed by the id the P/D deployment's API returned (`cmpl-…`). vLLM's
-- engine request id is that id plus "-" and 8 random characters, and the connector writes
-- the API's id into `requests.external_request_id`; on /v1/completions vLLM also numbers
-- each prompt of one call (`<id>-0`), so an external id with such a number joins its call's
-- id too.

-- _requests_by_api_id: every decode-side request under the API id(s) it answers to.
CREATE OR REPLACE VIEW _requests_by_api_id AS
SELECT *, external_request_id AS api_id FROM requests WHERE external_request_id IS NOT NULL
UNION ALL
SELECT *, regexp_extract(external_request_id, '^(.+)-[0-9]+$', 1) AS api_id
FROM requests WHERE regexp_matches(external_request_id, '^.+-[0-9]+$');

-- verification_handoffs: one row per verification, with the trace's request when one
-- answers to its P/D id (several decode engines never share one API id; if they did,
-- each is a row).
--
-- @columns-of verifications
-- @column engine_id            the decode engine (null: not in the trace)
-- @column request_id           its request id (null: not in the trace)
-- @column remote_engine_id     the prefill engine
-- @column remote_request_id    the prefill engine's request id
-- @column request_status       the request record's status
-- @column cached_tokens        the handoff as the trace tells it: tokens the decoder held
-- @column missing_tokens       tokens it did not
-- @column transferred_tokens   tokens whose KV crossed
-- @column reused_tokens        transferred tokens the decoder resumed from
-- @column recomputed_tokens    tokens the decoder prefilled itself
-- @column boundary_tokens      prefix length the state snapshot stands for
-- @column state_blocks         state blocks read
-- @column trace_prompt_tokens  the prompt's tokens as the trace counts them
CREATE OR REPLACE VIEW verification_handoffs AS
SELECT v.*, r.engine_id, r.request_id, r.remote_engine_id, r.remote_request_id, r.status AS request_status,
       r.cached_tokens, r.missing_tokens, r.transferred_tokens, r.reused_tokens, r.recomputed_tokens,
       r.boundary_tokens, r.state_blocks, r.prompt_tokens AS trace_prompt_tokens
FROM verifications v
LEFT JOIN _requests_by_api_id r ON r.api_id = v.pd_response_id;

-- _handoff_findings: the request-scope findings of every handoff (kind, engine, request),
-- for output_mismatch's evidence. The analyzer points this view at the findings it has
-- already computed, so the rules do not run twice; on its own it runs them.
CREATE OR REPLACE VIEW _handoff_findings AS
SELECT kind, engine_id, request_id FROM finding_padding_leak
UNION ALL SELECT kind, engine_id, request_id FROM finding_staging_copy
UNION ALL SELECT kind, engine_id, request_id FROM finding_useless_boundary
UNION ALL SELECT kind, engine_id, request_id FROM finding_descriptor_bound
UNION ALL SELECT kind, engine_id, request_id FROM finding_kv_expired
UNION ALL SELECT kind, engine_id, request_id FROM finding_transfer_failed
UNION ALL SELECT kind, engine_id, request_id FROM finding_unsharded_state
UNION ALL SELECT kind, engine_id, request_id FROM finding_recompute_cheaper;

-- verification_runs: one row per verify run: when, against what, and its outcomes.
--
-- @column run_id            the verify run
-- @column started_ts        its first check, epoch s
-- @column ended_ts          its last check, epoch s
-- @column model             the model compared
-- @column pd_url            the P/D deployment's URL
-- @column control_url       the colocated control's URL
-- @column prompts           prompts checked
-- @column matched           outputs that matched
-- @column near_ties         partings at a near tie
-- @column mismatches        real partings
-- @column errors            prompts that got no answer
-- @column max_logprob_diff  the largest logprob difference seen
CREATE OR REPLACE VIEW verification_runs AS
SELECT run_id, min(ts) AS started_ts, max(ts) AS ended_ts, any_value(model) AS model,
       any_value(pd_url) AS pd_url, any_value(control_url) AS control_url, count(*) AS prompts,
       count(*) FILTER (WHERE status = 'match') AS matched,
       count(*) FILTER (WHERE status = 'near_tie') AS near_ties,
       count(*) FILTER (WHERE status = 'mismatch') AS mismatches,
       count(*) FILTER (WHERE status = 'error') AS errors,
       max(max_logprob_diff) AS max_logprob_diff
FROM verifications
GROUP BY run_id;
