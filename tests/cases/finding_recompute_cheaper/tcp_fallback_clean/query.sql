-- finding_recompute_cheaper/tcp_fallback_clean: the clean twin of tcp_fallback: no finding of any kind.
--
-- The reads fell back to TCP: the slowest (rank 2) took 160 ms; the decoder prefills the
-- same 1,000 tokens in 100 ms (measured), so 0.16 > 0.1 × margin 1.0.
SELECT kind, engine_id, request_id, rank FROM analysis
