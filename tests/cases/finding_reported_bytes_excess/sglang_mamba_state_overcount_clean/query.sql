-- finding_reported_bytes_excess/sglang_mamba_state_overcount_clean: the twin of
-- sglang_mamba_state_overcount whose SGLang counts the state once (one state component): no finding
-- of any kind.
--   SGLang's count: 1,001 × 24,576 + 1 × 148,865,024 = 173,465,600 B = 165.4296875 MiB, printed
--   "165.43 MB" → 165.43 × 2^20 = 173,465,927.68 → 173,465,928 B
--   allowed (as in the twin) = 181,113,979 ≥ 173,465,928: not flagged (328 B over logical, the print's)
--   speed 165.4296875 / 1024 / 0.01 s → "16.16 GB/s" = 17.35 GB/s, below the link
SELECT kind, severity, engine_id, rank, request_id, message, evidence
FROM analysis
ORDER BY kind, engine_id, request_id
