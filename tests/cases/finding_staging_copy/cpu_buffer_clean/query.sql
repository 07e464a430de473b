-- finding_staging_copy/cpu_buffer_clean: the clean twin of cpu_buffer: no finding of any kind.
--
-- CONTRACT §6: a KV cache registered with kv_buffer_device cpu is a staging copy even when
-- the connector reports staging_bytes 0.
SELECT kind, engine_id, request_id, rank FROM analysis
