-- finding_kv_expired/released: the fault, worked out by hand.
--
-- As kv_expired, and every prefill rank also wrote its release record for the request:
-- the decode side's expiry and the prefill side's four releases are one finding.
SELECT kind, severity, engine_id, request_id, rank, remote_engine_id, evidence
FROM analysis
