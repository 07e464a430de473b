-- finding_useless_boundary/state_alone_clean: the clean twin of state_alone: no finding of any kind.
--
-- Each rank received the state snapshot for token 1,000 (18,866,176 B) but no attention
-- block: the state cannot be resumed from, and the decoder prefilled all 1,001 tokens.
SELECT kind, engine_id, request_id, rank FROM analysis
