-- finding_config_mismatch/conv_dtype: the fault, worked out by hand.
--
-- The prefill engine keeps its conv state in float32, the decoder in bfloat16: the conv
-- pages differ in size, so the state cannot be read across as it lies.
-- (the evidence fields worked out above; the others are the rule's own)
SELECT kind, severity, engine_id, request_id, rank, remote_engine_id,
       json_extract(evidence, '$.differs') AS differs,
       json_extract(evidence, '$.decode_mamba_cache_dtype') AS decode_mamba_cache_dtype,
       json_extract(evidence, '$.prefill_mamba_cache_dtype') AS prefill_mamba_cache_dtype
FROM analysis
