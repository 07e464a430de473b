-- finding_staging_copy/host_copies: the fault, worked out by hand.
--
-- The decode engine registered its KV with a host buffer: each read was also copied
-- device↔host (staging_bytes = the payload); NIXL's bytes do not count the copy.
-- staged 4 × 27,123,712 = 108,494,848; transported 108,494,848 ≤ reserved 110,100,480: not counted.
SELECT kind, severity, engine_id, request_id, rank, remote_engine_id, evidence
FROM analysis
