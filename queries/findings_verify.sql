-- findings_verify: the finding rule over `hybridtrace verify` results (columns as in
-- findings_requests).
-- include: verifications

-- finding_output_mismatch: a prompt's greedy output from the P/D deployment parted from
-- the colocated control's, and not at a near tie: the decoder resumed from state that
-- was not the prompt's. Evidence: where the outputs part, the handoff's boundary and state
-- blocks as the trace recorded them, its reads per rank, the log events that name it, and
-- the other findings on the same handoff (an expired lease, a failed read, padding,
-- unsharded state…), which are where to look first.
CREATE OR REPLACE VIEW finding_output_mismatch AS
WITH m AS (
    SELECT * FROM verification_handoffs WHERE status = 'mismatch'
),
reads AS (
    SELECT engine_id, request_id, count(*) AS reads,
           list(DISTINCT rank ORDER BY rank) AS ranks,
           count(*) FILTER (WHERE status IS DISTINCT FROM 'ok') AS reads_not_ok,
           sum(transported_bytes) AS transported_bytes,
           sum(state_transported_bytes) AS state_transported_bytes,
           list({'rank': rank, 'remote_rank': remote_rank, 'status': status, 'bytes': transported_bytes,
                 'state_bytes': state_transported_bytes, 'xfer_s': xfer_s}
                ORDER BY rank, remote_rank, ts) AS per_read
    FROM transfers
    WHERE (engine_id, request_id) IN (SELECT (engine_id, request_id) FROM m)
    GROUP BY engine_id, request_id
),
events AS (
    SELECT m.engine_id, m.request_id, count(*) AS log_events, list(DISTINCT e.kind ORDER BY e.kind) AS kinds
    FROM m JOIN log_events e ON e.request_id IN (m.request_id, m.remote_request_id)
    GROUP BY m.engine_id, m.request_id
),
others AS (
    SELECT engine_id, request_id, list(DISTINCT kind ORDER BY kind) AS kinds
    FROM _handoff_findings
    WHERE (engine_id, request_id) IN (SELECT (engine_id, request_id) FROM m)
    GROUP BY engine_id, request_id
)
SELECT
    'output_mismatch' AS kind, 'error' AS severity, m.engine_id, CAST(NULL AS INTEGER) AS rank,
    coalesce(m.request_id, m.pd_response_id) AS request_id, m.remote_engine_id,
    CAST(NULL AS DOUBLE) AS start_ts, CAST(NULL AS DOUBLE) AS end_ts,
    'the P/D output parts from the colocated control at output token ' || m.first_divergence
        || ' of ' || m.tokens_compared
        || CASE WHEN m.control_top_gap IS NOT NULL
                THEN ' (the control''s top two were ' || round(m.control_top_gap, 3) || ' nats apart: not a near tie)'
                ELSE '' END
        || CASE WHEN m.request_id IS NULL
                THEN '; no request in the trace answers to ' || coalesce(m.pd_response_id, '?')
                ELSE '; its handoff moved ' || coalesce(CAST(m.transferred_tokens AS VARCHAR), '?') || ' tokens and '
                     || coalesce(CAST(m.state_blocks AS VARCHAR), '?') || ' state blocks over '
                     || coalesce(r.reads, 0) || ' reads'
                     || CASE WHEN o.kinds IS NOT NULL THEN ', with ' || array_to_string(o.kinds, ', ') ELSE '' END
           END AS message,
    CAST(json_object(
        'prompt_id', m.prompt_id, 'prompt_index', m.prompt_index, 'run_id', m.run_id,
        'pd_response_id', m.pd_response_id, 'control_response_id', m.control_response_id, 'model', m.model,
        'first_divergence', m.first_divergence, 'tokens_compared', m.tokens_compared,
        'pd_tokens', m.pd_tokens, 'control_tokens', m.control_tokens,
        'control_top_gap', m.control_top_gap, 'pd_token_control_logprob', m.pd_token_control_logprob,
        'max_logprob_diff', m.max_logprob_diff, 'prompt_tokens', m.prompt_tokens,
        'in_trace', m.request_id IS NOT NULL, 'request_status', m.request_status,
        'remote_request_id', m.remote_request_id,
        'cached_tokens', m.cached_tokens, 'missing_tokens', m.missing_tokens,
        'transferred_tokens', m.transferred_tokens, 'reused_tokens', m.reused_tokens,
        'recomputed_tokens', m.recomputed_tokens, 'boundary_tokens', m.boundary_tokens,
        'state_blocks', m.state_blocks,
        'reads', coalesce(r.reads, 0), 'ranks', coalesce(r.ranks, []), 'reads_not_ok', coalesce(r.reads_not_ok, 0),
        'transported_bytes', r.transported_bytes, 'state_transported_bytes', r.state_transported_bytes,
        'per_read', coalesce(r.per_read, []),
        'log_events', coalesce(e.log_events, 0), 'log_event_kinds', coalesce(e.kinds, []),
        'handoff_findings', coalesce(o.kinds, [])) AS VARCHAR) AS evidence
FROM m
LEFT JOIN reads r USING (engine_id, request_id)
LEFT JOIN events e USING (engine_id, request_id)
LEFT JOIN others o USING (engine_id, request_id);
