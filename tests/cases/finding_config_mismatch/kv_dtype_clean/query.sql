-- finding_config_mismatch/kv_dtype_clean: the clean twin of kv_dtype: no finding of any kind.
--
-- The prefill engine runs an fp8 KV cache, the decoder bfloat16.
SELECT kind, engine_id, request_id, rank FROM analysis
