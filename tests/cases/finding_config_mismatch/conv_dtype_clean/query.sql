-- finding_config_mismatch/conv_dtype_clean: the clean twin of conv_dtype: no finding of any kind.
--
-- The prefill engine keeps its conv state in float32, the decoder in bfloat16: the conv
-- pages differ in size, so the state cannot be read across as it lies.
SELECT kind, engine_id, request_id, rank FROM analysis
