-- finding_transfer_failed/failed_rank_clean: the clean twin of failed_rank: no finding of any kind.
--
-- Rank 3's read failed; no token arrived whole, so the decoder prefilled all 1,001.
SELECT kind, engine_id, request_id, rank FROM analysis
