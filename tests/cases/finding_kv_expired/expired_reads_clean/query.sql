-- finding_kv_expired/expired_reads_clean: the clean twin of expired_reads: no finding of any kind.
--
-- The prefill engine released the blocks first: every read expired with nothing moved,
-- and the decoder prefilled the whole prompt.
SELECT kind, engine_id, request_id, rank FROM analysis
