-- finding_transfer_failed/failed_rank: the fault, worked out by hand.
--
-- Rank 3's read failed; no token arrived whole, so the decoder prefilled all 1,001.
SELECT kind, severity, engine_id, request_id, rank, remote_engine_id, evidence
FROM analysis
