-- finding_slow_rank/rank_2_slow_fitted: the fault, with enough reads for the fitted link to agree.
--
-- Eight reads per rank in one window, k × 10,000,000 bytes (k = 1…8), 80 descriptors each
-- (a constant count: the fit leaves the descriptor term out). Ranks 0, 1 and 3 take
-- 1 ms + bytes / 5 GB/s, rank 2 takes 1 ms + bytes / 1.25 GB/s: every read lies on its
-- rank's line, so each rank's fit is that line (8 reads used, median error 0).
-- Windows: rank 2's per-read rates are 1e7/0.009 … 8e7/0.065; their median is
-- (4e7/0.033 + 5e7/0.041) / 2 = 1.215816704 GB/s; each peer's is (4e7/0.009 + 5e7/0.011) / 2
-- = 4.494949495 GB/s (ratio 0.27 < 0.6 in 1 of 1 windows: slow).
-- Fit: rank 2 at 1.25e9 B/s against its peers' median 5e9 B/s: 0.25 < slow_rank_fit_ratio
-- 0.6, so the fit agrees.
SELECT kind, severity, engine_id, rank,
       round(CAST(evidence ->> 'median_gb_s' AS DOUBLE), 9) AS median_gb_s,
       round(CAST(evidence ->> 'peer_median_gb_s' AS DOUBLE), 9) AS peer_median_gb_s,
       CAST(evidence ->> 'fit_agrees' AS BOOLEAN) AS fit_agrees,
       round(CAST(evidence ->> 'fit_bandwidth_bytes_per_s' AS DOUBLE)) AS fit_bandwidth_bytes_per_s,
       round(CAST(evidence ->> 'fit_peer_bandwidth_bytes_per_s' AS DOUBLE)) AS fit_peer_bandwidth_bytes_per_s,
       CAST(evidence ->> 'fit_transfers_used' AS BIGINT) AS fit_transfers_used
FROM analysis
