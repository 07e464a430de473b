-- finding_recompute_cheaper/fitted_link: the fault, judged by the fitted link: a handoff
-- whose reads are not in the trace.
--
-- Eight requests on the same pair have reads, without request records (k × 10,000,000 bytes,
-- k = 1…8, 80 descriptors each: a constant count, so no descriptor term): rank 0's take
-- 10 ms + bytes / 200 MB/s, rank 1's 10 ms + bytes / 100 MB/s, so each rank's fit is its
-- line (8 reads). Request r-rfit has a record and no read. One read of it, by the byte
-- model (tests/cases/README.md, TP 4 on both sides: share 1): 2 × 672 × 6,144 + 18,866,176
-- = 27,123,712 bytes. The critical path is the slowest rank's read: rank 1's fit gives
-- 0.01 + 27,123,712 / 1e8 = 0.28123712 s (rank 0's: 0.14561856 s) > prefill_s 0.1
-- (measured) × margin 1.0. (Rank 1 is also slow_rank's: that finding is not this case's.)
SELECT kind, severity, engine_id, request_id, remote_engine_id,
       round(CAST(evidence ->> 'critical_path_s' AS DOUBLE), 12) AS critical_path_s,
       CAST(evidence ->> 'prefill_s' AS DOUBLE) AS prefill_s,
       evidence ->> 'prefill' AS prefill,
       CAST(evidence ->> 'read_bytes' AS BIGINT) AS read_bytes,
       evidence ->> 'handoff_time_source' AS handoff_time_source,
       evidence ->> 'fit_scope' AS fit_scope,
       CAST(evidence ->> 'fit_rank' AS INTEGER) AS fit_rank,
       evidence ->> 'fit_source' AS fit_source,
       CAST(evidence ->> 'fit_transfers_used' AS BIGINT) AS fit_transfers_used
FROM analysis
WHERE kind = 'recompute_cheaper'
