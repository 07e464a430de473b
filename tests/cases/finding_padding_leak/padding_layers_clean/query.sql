-- finding_padding_leak/padding_layers_clean: the clean twin of padding_layers: no finding of any kind.
--
-- The 2 padding layers of the last Mamba group crossed too: 30 padded pages per rank.
-- 8,257,536 + 1 × 30 × 688,128 (20,643,840) = 28,901,376 per read; reserved counts the 28 real
-- layers (27,525,120), and the padding layers' 2 pages (1,376,256) are sized apart.
-- 4 × 28,901,376 = 115,605,504 transported; excess 4 × 1,777,664 = 7,110,656 = the padding gap
-- of the 28 real layers (4 × 401,408) + the 2 padding layers' pages (4 × 2 × 688,128 = 5,505,024).
SELECT kind, engine_id, request_id, rank FROM analysis
