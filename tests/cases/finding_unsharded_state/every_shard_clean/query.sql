-- finding_unsharded_state/every_shard_clean: the clean twin of every_shard: no finding of any kind.
--
-- Rank 1 pulled every rank's state shard: 8,257,536 + 4 × 18,866,176 = 83,722,240 B.
-- rank 1 moved 83,722,240 − 8,257,536 = 75,464,704 B of state (S at TP 1) ≥ 1.5 × 18,866,176;
-- excess 83,722,240 − 27,123,712 = 56,598,528 is not the 401,408 padding gap.
SELECT kind, engine_id, request_id, rank FROM analysis
