-- finding_reported_bytes_excess/sglang_mamba_state_overcount: an SGLang prefill server (data-parallel
-- rank 1 of its own, TP 1: the prefix "DP1" names no TP) serving NVIDIA Nemotron Nano 12B v2 logs a
-- transfer_total that counts the recurrent state twice, as CommonKVSender.get_transfer_metric does
-- when the state is registered as two components (conv and SSM state, one slot each):
-- (1 + 1) slots × (conv + SSM item lengths of all 28 Mamba layers). Its speed comes from Mooncake's
-- last-chunk latency (1 ms). The finding names the engine, its source kind and the excess.
--
-- Byte model at TP 1 (`hybridtrace model nemotron-nano-12b-v2 --tp 1`; SGLang's default SSM dtype is
-- float32, as vLLM's `auto` resolves it for Nemotron-H):
--   B = 6 attention layers × (K, V) × 8 heads × 128 × 2 B           = 24,576 B/token
--   conv = 28 × (4 − 1) × 12,288 × 2 B = 28 × 73,728                 = 2,064,384 B
--   SSM  = 28 × 128 heads × 80 × 128 × 4 B = 28 × 5,242,880          = 146,800,640 B
--   S = conv + SSM                                                    = 148,865,024 B
--   block = 1,312 tokens (vLLM's alignment for this page size)
-- The request: input len 1,001 → T = 1,001 (prefill sends the prompt), J = 1.
--   logical        = 24,576 × 1,001 + 148,865,024 = 24,600,576 + 148,865,024 = 173,465,600
--   block rounding = ceil(1,001 / 1,312) × 1,312 = 1,312 tokens → 311 × 24,576 = 7,643,136
--   expected       = 181,108,736;   allowed = expected + 5,243 (2-decimal MiB) = 181,113,979
-- SGLang's count: 1,001 × 24,576 + 2 × 148,865,024 = 322,330,624 B = 307.3984375 MiB, printed
-- "307.40 MB" → 307.40 × 2^20 = 322,332,262.4 → 322,332,262 B;
--   excess = 322,332,262 − 181,108,736 = 141,223,526 (> 5,243: flagged; the state once more, less
--   the block rounding, plus the print's +1,638)
-- Speed: 307.3984375 / 1024 / 0.001 s = 300.19 GiB/s printed → 300.19 × 2^30 = 322,326,558,146.56 B/s,
-- above the 50 GB/s link: named in the message and the evidence.
-- The decode server's line (same bootstrap_room) has no transfer figures: no row, no finding.
SELECT kind, severity, engine_id, rank, request_id, message, evidence
FROM analysis
ORDER BY kind, engine_id, request_id
