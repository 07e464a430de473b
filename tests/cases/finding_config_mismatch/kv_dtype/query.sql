-- finding_config_mismatch/kv_dtype: the fault, worked out by hand.
--
-- The prefill engine runs an fp8 KV cache, the decoder bfloat16.
SELECT kind, severity, engine_id, request_id, rank, remote_engine_id, evidence
FROM analysis
