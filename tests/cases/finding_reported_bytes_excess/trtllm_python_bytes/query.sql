-- finding_reported_bytes_excess/trtllm_python_bytes: TensorRT-LLM's Python transceiver rows of a
-- context instance (ctx-trt, rank 0 of TP 4) whose byte counts are exact, so a single byte over
-- what the request explains is flagged. Byte model per rank: NVIDIA Nemotron Nano 12B v2 at TP 4
-- (tests/cases/README.md): B = 6,144 B/token, S = 18,866,176 B, block 672 tokens.
--
-- Request 7 (T = transferred_tokens 1,000; J = 1), two KVSendTask rows, one per peer rank (a decode
-- TP of 8 takes half the rank's heads each): 13,762,560 + 13,762,560 = 27,525,120 B.
--   logical  = 6,144 × 1,000 + 18,866,176 = 25,010,176
--   rounding = ceil(1,000 / 672) = 2 blocks = 1,344 tokens → 344 × 6,144 = 2,113,536
--   expected = allowed (report rounding 0) = 27,123,712
--   excess   = 27,525,120 − 27,123,712 = 401,408 = 28 × 14,336: the state sent as padded pages.
--   The highest reported rate, 20 GB/s, is below the 50 GB/s link: not in the message.
-- Request 9 (no transferred_tokens: T = prompt 1,001): one row of 27,123,713 B at 60 GB/s.
--   logical  = 6,144 × 1,001 + 18,866,176 = 25,016,320; rounding 343 × 6,144 = 2,107,392
--   expected = 27,123,712; excess = 1 B (flagged: the count is exact); 60 GB/s is named.
-- Not judged: the generation side's KVRecvTask row (side recv) and the C++ measure (no byte count).
SELECT kind, severity, engine_id, rank, request_id, remote_engine_id, message, evidence
FROM finding_reported_bytes_excess
ORDER BY engine_id, request_id
