-- transfer_bytes/totals_over_requests: _accounting_totals sums each request's reads grouped once,
-- and gives the sums of transfer_bytes read by read, also for a request whose reads make
-- different shares. Byte model as in share_of_a_wider_prefill (B = 100, S = 1,000, block 16,
-- padded state 1,200); every request has T = 40, J = 1 except r-untold (no T).
--   share 2 (TP 2 reading TP 4): logical 2,500, expected 2,900, reserved 3,000 per read
--   share 1 (TP 2 reading TP 2, or TP 1: greatest(1, 1 // 2)): logical 100 × 40 + 1,000 = 5,000,
--     expected 3 × 16 × 100 + 1,000 = 5,800, reserved 4,800 + 1,200 = 6,000 per read
-- r-1: two successful reads at share 2 and a failed one; r-mixed: one read at share 2, two at
-- share 1; r-untold: one successful read, no counts; r-failed: one failed read. decode-b has
-- no byte model: its read is not accounted.
--   reads       = 3 + 3 + 1 + 1 = 8; successful 2 + 3 + 1 = 6; sized 2 + 3 = 5
--   logical     = 2 × 2,500 + (2,500 + 2 × 5,000)    = 5,000 + 12,500 = 17,500
--   expected    = 2 × 2,900 + (2,900 + 2 × 5,800)    = 5,800 + 14,500 = 20,300
--   reserved    = 2 × 3,000 + (3,000 + 2 × 6,000)    = 6,000 + 15,000 = 21,000
--   transported = (2,900 + 3,000) + (2,900 + 5,800 + 5,800) + 2,900 = 23,300; sized 23,300 − 2,900 = 20,400
-- The second row sums transfer_bytes read by read: the same.
SELECT 'totals' AS source, * FROM _accounting_totals
UNION ALL
SELECT 'per read', count(*), count(*) FILTER (WHERE status = 'ok'),
       count(*) FILTER (WHERE status = 'ok' AND expected_bytes IS NOT NULL),
       sum(logical_bytes) FILTER (WHERE status = 'ok'), sum(expected_bytes) FILTER (WHERE status = 'ok'),
       sum(reserved_bytes) FILTER (WHERE status = 'ok'), sum(transported_bytes) FILTER (WHERE status = 'ok'),
       sum(transported_bytes) FILTER (WHERE status = 'ok' AND expected_bytes IS NOT NULL)
FROM transfer_bytes
ORDER BY source DESC
