-- finding_reported_bytes_excess/trtllm_python_bytes_clean: the twin of trtllm_python_bytes whose
-- counts a correct transceiver gives: no finding.
--   request 7: 12,505,088 × 2 peers = 25,010,176 = logical ≤ expected 27,123,712
--   request 9: 27,123,712 = expected exactly (whole blocks): not more, not flagged
SELECT kind, severity, engine_id, rank, request_id, remote_engine_id, message, evidence
FROM finding_reported_bytes_excess
ORDER BY engine_id, request_id
