-- finding_useless_boundary/block_boundary: the fault, worked out by hand.
--
-- All 1,000 tokens crossed, but the state snapshot sits at the 672-token block boundary:
-- the decoder resumed at 672 and prefilled 1001 − 672 = 329 tokens itself.
SELECT kind, severity, engine_id, request_id, rank, remote_engine_id, evidence
FROM analysis
