-- finding_recompute_cheaper/tcp_fallback: the fault, worked out by hand.
--
-- The reads fell back to TCP: the slowest (rank 2) took 160 ms; the decoder prefills the
-- same 1,000 tokens in 100 ms (measured), so 0.16 > 0.1 × margin 1.0.
SELECT kind, severity, engine_id, request_id, rank, remote_engine_id, evidence
FROM analysis
