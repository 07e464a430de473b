-- interval_bytes/three_engines: Prometheus intervals (exact bytes, no tolerance) of three engines
-- the trace does not cover, each sized as Nemotron Nano 12B v2 at TP 4 (tests/cases/README.md):
-- P = 672 × 6,144 = 4,128,768 B a block, S = 18,866,176, S_padded = 19,267,584, L = 2 × 688,128
-- = 1,376,256. Each interval has n = 4 reads of 2 blocks (8,257,536 B) and one state snapshot.
--   native-pad, 4 × (8,257,536 + 19,267,584) = 110,100,480:
--     total − 4·S = 34,635,776 = 8P + 1,605,632 → off min(1,605,632, 2,523,136) = 1,605,632
--     total − 4·S_padded = 33,030,144 = 8P exactly → 'padded', all 4 reads
--     total − 4·(S_padded + L) = 27,525,120 = 6P + 2,752,512 → off 1,376,256
--   native-clean, 4 × 27,123,712 = 108,494,848:
--     total − 4·S = 33,030,144 = 8P → 'unpadded' (padded: 7P + 2,523,136 → off 1,605,632;
--     with the layers: 6P + 1,146,880 → off 1,146,880)
--   native-odd, 111,100,480 (1,000,000 B more than padded): clean off 1,523,136, padded off
--     1,000,000, layers off 376,256, and m = 1, 2, 3 padded reads (each + 401,408) leave
--     1,924,544, 1,802,816, 1,401,408: nothing fits → 'unexplained'
SELECT engine_id, start_ts, transfers, total_bytes, CAST(tolerance_bytes AS DOUBLE) AS tolerance_bytes,
       clean_off_bytes, padded_off_bytes,
       layers_off_bytes, clean_fit, padded_fit, fitting_counts, with_padding_layers, padded_reads, verdict
FROM interval_bytes
ORDER BY engine_id, start_ts
