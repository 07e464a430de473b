-- finding_staging_copy/unexplained_excess_clean: the clean twin of unexplained_excess: no finding of any kind.
--
-- Each read reports 4,000,000 B more than the payload, with no staging said and the KV on
-- the GPU: 31,123,712 > reserved 27,525,120 + the padding layers' 1,376,256 + 4,096 of slack,
-- and as state it would be 22,866,176 < 1.5 × 18,866,176, so not an unsharded pull.
-- 4 × 31,123,712 = 124,494,848 transported against 4 × 27,525,120 = 110,100,480 reserved.
SELECT kind, engine_id, request_id, rank FROM analysis
