-- finding_kv_expired/expired_reads: the fault, worked out by hand.
--
-- The prefill engine released the blocks first: every read expired with nothing moved,
-- and the decoder prefilled the whole prompt.
SELECT kind, severity, engine_id, request_id, rank, remote_engine_id, evidence
FROM analysis
