-- finding_native_unexplained/bytes_no_reading_explains: the intervals of interval_bytes/three_engines.
-- native-odd moved 1,000,000 B that neither unpadded, padded, padded-with-layers nor any partial
-- count of padded reads explains (worked out in interval_bytes/three_engines): one finding with
-- its 4 reads. native-pad and native-clean are explained: no finding.
SELECT kind, severity, engine_id, start_ts, end_ts, message, evidence
FROM finding_native_unexplained
ORDER BY engine_id
