-- finding_native_padding/padded_scrapes: the intervals of interval_bytes/three_engines. native-pad's
-- two intervals are both 'padded' (4 of 4 reads each): one padding_leak for the engine, spanning
-- 100 → 120 s, with 8 padded reads of 8. native-clean is 'unpadded': its clean twin, no finding;
-- native-odd's interval is 'unexplained', which decides nothing here (native_unexplained's).
SELECT kind, severity, engine_id, rank, request_id, start_ts, end_ts, message, evidence
FROM finding_native_padding
ORDER BY engine_id
