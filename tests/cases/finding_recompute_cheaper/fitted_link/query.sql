-- finding_recompute_cheaper/fitted_link: the fault, judged by the fitted link: a handoff
-- whose reads are not in the trace.
--
-- Eight reads of other requests on the same pair (rank 0, k × 10,000,000 bytes, k = 1…8)
-- take 10 ms + bytes / 200 MB/s: the pair's fit is that line (8 reads; 80 descriptors
-- each, a constant count, so no descriptor term). Request r-rfit has a record and no read.
-- One read of it, by the byte model (tests/cases/README.md, TP 4 on both sides: share 1):
-- 2 × 672 × 6,144 + 18,866,176 = 27,123,712 bytes; fitted time 0.01 + 27,123,712 / 2e8
-- = 0.14561856 s > prefill_s 0.1 (measured) × margin 1.0.
SELECT kind, severity, engine_id, request_id, remote_engine_id,
       round(CAST(evidence ->> 'critical_path_s' AS DOUBLE), 12) AS critical_path_s,
       CAST(evidence ->> 'prefill_s' AS DOUBLE) AS prefill_s,
       evidence ->> 'prefill' AS prefill,
       CAST(evidence ->> 'read_bytes' AS BIGINT) AS read_bytes,
       evidence ->> 'handoff_time_source' AS handoff_time_source,
       evidence ->> 'fit_scope' AS fit_scope,
       CAST(evidence ->> 'fit_transfers_used' AS BIGINT) AS fit_transfers_used
FROM analysis
