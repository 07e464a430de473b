-- finding_useless_boundary/state_alone: the fault, worked out by hand.
--
-- Each rank received the state snapshot for token 1,000 (18,866,176 B) but no attention
-- block: the state cannot be resumed from, and the decoder prefilled all 1,001 tokens.
SELECT kind, severity, engine_id, request_id, rank, remote_engine_id, evidence
FROM analysis
