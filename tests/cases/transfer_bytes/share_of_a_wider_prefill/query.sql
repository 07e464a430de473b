-- transfer_bytes/share_of_a_wider_prefill: a TP 2 decode engine reading from a TP 4 prefill
-- engine makes share = 4 / 2 = 2 reads per rank and request, each carrying half of its rank's
-- bytes. Byte model (per decode rank): B = 100 B/token, S = 1,000 B, block 16 tokens, padded
-- page 60 B × 20 layers = 1,200 B of state, 2 padding layers (120 B). Request r-1: T = 40, J = 1.
--   logical     = 100 × 40 // 2 + 1,000 × 1 // 2                    = 2,000 + 500 = 2,500
--   expected    = ceil(40 / 16) = 3 blocks × 16 × 100 // 2 + 500    = 2,400 + 500 = 2,900
--   reserved    = 2,400 + 1,200 × 1 // 2                            = 2,400 + 600 = 3,000
--   block rounding = 2,900 − 2,500 = 400; padding gap = 3,000 − 2,900 = 100;
--   padding layers = 60 × 2 × 1 // 2 = 60
-- The first read moved 2,900 (excess 0), the second the padded 3,000 (excess 100); the failed
-- read moved nothing and is a row all the same (its excess, −2,900, is what it did not move). r-untold gives no T: a row without counts.
-- decode-b has no byte model: its read is not accounted.
SELECT request_id, rank, remote_rank, status, share, logical_bytes, expected_bytes, reserved_bytes,
       transported_bytes, block_rounding_bytes, excess_bytes, padding_gap_bytes, padding_layers_bytes
FROM transfer_bytes
ORDER BY request_id, ts
