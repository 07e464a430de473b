-- finding_slow_rank/rank_2_slow_fitted_clean: the clean twin of rank_2_slow_fitted: no finding of any kind.
--
-- The same 32 reads, rank 2 at 1 ms + bytes / 5 GB/s like its peers: every rank's per-read
-- median is 4.494949495 GB/s and every rank's fit 5e9 B/s (ratio 1): nothing is slow.
SELECT kind, engine_id, request_id, rank FROM analysis
