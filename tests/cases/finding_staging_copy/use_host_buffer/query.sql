-- finding_staging_copy/use_host_buffer: the fault, worked out by hand.
--
-- Both twins register the KV cache with kv_buffer_device cpu; the trace says whether reads
-- go through a host staging buffer. On a CPU platform the cache is in host memory itself
-- and vLLM stages nothing (use_host_buffer false): the device alone is no staging copy.
-- as cpu_buffer, but the trace says use_host_buffer true; its clean twin says false
SELECT kind, severity, engine_id, request_id, rank, remote_engine_id, evidence
FROM analysis
