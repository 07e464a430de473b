-- request_bytes/failed_read_counts_in_reads_only: the reads of transfer_bytes/share_of_a_wider_prefill
-- summed per request. r-1 has 3 reads on 2 decode ranks; the failed one counts in `reads` only:
--   logical 2 × 2,500 = 5,000; expected 2 × 2,900 = 5,800; reserved 2 × 3,000 = 6,000;
--   transported 2,900 + 3,000 = 5,900; excess 0 + 100 = 100
--   transported / expected = 5,900 / 5,800 = 1.017241…; transported / logical = 5,900 / 5,000 = 1.18
-- (ratios of the sums). r-untold gives no T: transported only, no counts and no ratios.
SELECT request_id, reads, ranks, logical_bytes, expected_bytes, reserved_bytes, transported_bytes,
       transported_over_expected, transported_over_logical, excess_bytes
FROM request_bytes
ORDER BY request_id
