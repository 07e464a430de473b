-- finding_staging_copy/copies_counted_clean: the clean twin of copies_counted: no finding of any kind.
--
-- As staging_copy, but NIXL's bytes count the copy too: each read reports 2 × 27,123,712.
-- The excess is the copy, not a rank pulling other ranks' state: no unsharded_state.
-- transported 4 × 54,247,424 = 216,989,696 > reserved 110,100,480 + the padding layers'
-- pages 4 × 1,376,256: the copies are counted.
SELECT kind, engine_id, request_id, rank FROM analysis
