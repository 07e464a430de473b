-- reported_bytes/trtllm_rows: the tables of finding_reported_bytes_excess/trtllm_python_bytes, plus a
-- send row of ctx-trt rank 1 for request 10, which no request record names.
-- One row per request and sending rank with reported bytes: request 7's two peer rows summed
-- (27,525,120), request 9 (T from the prompt), request 10 kept with its bytes and why it is not
-- judged. The recv row and the C++ measure without bytes give no row. Arithmetic in the finding case.
SELECT engine_id, source_kind, request_id, rank, start_ts, end_ts, send_rows, peers, transported_bytes,
       reported_bytes_per_s, tokens, state_snapshots, logical_bytes, block_rounding_bytes, expected_bytes,
       report_rounding_bytes, allowed_bytes, excess_bytes, unsized
FROM reported_bytes
ORDER BY engine_id, request_id, rank
