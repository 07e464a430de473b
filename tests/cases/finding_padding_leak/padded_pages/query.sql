-- finding_padding_leak/padded_pages: the fault, worked out by hand.
--
-- Every rank's state crossed as 28 padded pages: 27,525,120 B instead of 27,123,712.
-- 4 reads × 27,525,120 = 110,100,480 transported = reserved; expected 4 × 27,123,712 = 108,494,848;
-- excess = padding gap = 4 × 401,408 = 1,605,632.
SELECT kind, severity, engine_id, request_id, rank, remote_engine_id, evidence
FROM analysis
