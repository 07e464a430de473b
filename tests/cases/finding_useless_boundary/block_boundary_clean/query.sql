-- finding_useless_boundary/block_boundary_clean: the clean twin of block_boundary: no finding of any kind.
--
-- All 1,000 tokens crossed, but the state snapshot sits at the 672-token block boundary:
-- the decoder resumed at 672 and prefilled 1001 − 672 = 329 tokens itself.
SELECT kind, engine_id, request_id, rank FROM analysis
