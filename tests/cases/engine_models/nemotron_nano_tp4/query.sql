-- engine_models/nemotron_nano_tp4: both engines of a by-hand case sized as tests/cases/README.md
-- works them out, which every finding case measures its reads against:
--   B = 6 × 1,024 = 6,144 B/token; S = 28 × 673,792 = 18,866,176 B; block 16 × 42 = 672 tokens;
--   padded page 672 × 1,024 = 688,128 B; 28 recurrent layers; 2 padding layers (5 groups × 6 − 28).
SELECT DISTINCT attention_bytes_per_token, state_bytes, block_tokens, mamba_padded_page_bytes,
       recurrent_layers, padding_layers
FROM engine_models
