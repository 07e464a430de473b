-- finding_staging_copy/cpu_buffer: the fault, worked out by hand.
--
-- CONTRACT §6: a KV cache registered with kv_buffer_device cpu is a staging copy even when
-- the connector reports staging_bytes 0.
-- (the evidence fields worked out above; the others are the rule's own)
SELECT kind, severity, engine_id, request_id, rank, remote_engine_id,
       json_extract(evidence, '$.reads') AS reads,
       json_extract(evidence, '$.transported_bytes') AS transported_bytes,
       json_extract(evidence, '$.copies_counted_in_transport') AS copies_counted_in_transport
FROM analysis
