-- intervals/scrape_read_in_two_slices: a file of two scrapes (ts 100 and 110) read in two
-- slices, the second scrape cut between its `_count` line (line 3, first slice) and its
-- `_sum` line (line 4, second slice). The scrape at 110 makes one interval, 100 → 110:
-- 14 − 10 = 4 transfers, (0.7 − 0.5) / 4 = 0.05 s each. It names its first line (3) and
-- that line's source, the first slice, whichever way the samples are grouped (the second
-- slice's id sorts first, so neither the least id nor an arbitrary one would give it).
SELECT engine_id, source_kind, start_ts, end_ts, transfers, round(avg_xfer_s, 12) AS avg_xfer_s,
       source_id, line_number
FROM intervals
ORDER BY end_ts
