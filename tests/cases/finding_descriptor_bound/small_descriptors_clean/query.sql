-- finding_descriptor_bound/small_descriptors_clean: the clean twin of small_descriptors: no finding of any kind.
--
-- The read was cut into 4 KiB descriptors: 27,123,712 / 4,096 = 6,622 per read, and posting
-- them took 4 of the read's 5 ms (share 0.8 ≥ 0.5).
-- 4 × 6,622 = 26,488 descriptors; post 4 × 0.004 = 0.016 s of xfer 4 × 0.005 = 0.02 s;
-- 108,494,848 / 26,488 = 4,096 B per descriptor.
SELECT kind, engine_id, request_id, rank FROM analysis
