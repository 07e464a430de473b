-- finding_config_mismatch/block_size: the fault, worked out by hand.
--
-- The prefill engine keeps vLLM's float32 SSM default: its Mamba page is 18,432 + 1,310,720
-- = 1,329,152 B, so its attention block is 16 × ceil(1,329,152 / 16,384) = 1,312 tokens against
-- the decoder's 672 (CONTRACT §6 lists block size among config_mismatch's settings).
-- padded page 1,312 × 1,024 = 1,343,488 B; the same 1 + 5 groups of 6 layers
-- (the evidence fields worked out above; the others are the rule's own)
SELECT kind, severity, engine_id, request_id, rank, remote_engine_id,
       json_extract(evidence, '$.differs') AS differs,
       json_extract(evidence, '$.decode_block_tokens') AS decode_block_tokens,
       json_extract(evidence, '$.prefill_block_tokens') AS prefill_block_tokens
FROM analysis
