-- finding_recompute_cheaper/fitted_link_clean: the clean twin of fitted_link: no finding of any kind.
--
-- The same reads, both ranks at 10 ms + bytes / 5 GB/s: the fitted time of r-rfit's read
-- is 0.01 + 27,123,712 / 5e9 = 0.0154247424 s < prefill_s 0.1; no rank is slow.
SELECT kind, engine_id, request_id, rank FROM analysis
