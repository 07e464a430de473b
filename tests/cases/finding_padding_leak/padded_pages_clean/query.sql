-- finding_padding_leak/padded_pages_clean: the clean twin of padded_pages: no finding of any kind.
--
-- Every rank's state crossed as 28 padded pages: 27,525,120 B instead of 27,123,712.
-- 4 reads × 27,525,120 = 110,100,480 transported = reserved; expected 4 × 27,123,712 = 108,494,848;
-- excess = padding gap = 4 × 401,408 = 1,605,632.
SELECT kind, engine_id, request_id, rank FROM analysis
