-- finding_kv_expired/release_alone: the fault, worked out by hand.
--
-- The decode side recorded only that the handoff failed (no read, no expiry); the prefill
-- side's release record says why. It ties to the decode request by remote_request_id, as
-- an expiry log line does: a kv_expired finding beside the transfer_failed one.
-- (the evidence of the first finding is the one worked out above)
SELECT kind, severity, engine_id, request_id, rank, remote_engine_id, evidence
FROM analysis
