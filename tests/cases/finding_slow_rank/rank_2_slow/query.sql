-- finding_slow_rank/rank_2_slow: the fault, worked out by hand.
--
-- Three handoffs in one window; rank 2 takes 20 ms where its peers take 5 ms:
-- 27,123,712 / 0.020 = 1.3561856 GB/s against 27,123,712 / 0.005 = 5.4247424 GB/s (ratio 0.25 < 0.6).
-- 3 reads per rank in the window; critical path: rank 2 was the slowest read of all 3 requests.
SELECT kind, severity, engine_id, request_id, rank, remote_engine_id, evidence
FROM analysis
