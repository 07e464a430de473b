"""Byte model per architecture on real configs, expected numbers worked by hand.

The formulas (vLLM's, per TP rank):
  attention bytes/token/layer = max(1, kv_heads // tp) * 2 (K and V) * head * dtype
  Mamba2 conv  = (kernel - 1 + spec) * (inner + 2 * groups' * state) / tp * dtype
  Mamba2 ssm   = heads / tp * head_dim * state * dtype
  Mamba1 conv  = (kernel - 1) * inner / tp * dtype;  ssm = inner / tp * state * dtype
  GDN conv     = (kernel - 1 + spec) * (2 * k_heads * k_dim + v_heads * v_dim) / tp * dtype
  GDN ssm      = v_heads / tp * v_dim * k_dim * dtype
  block        = 16 * ceil(mamba_page / (16 * attn_1tok));  pad% = (block * attn_1tok - page) / page
"""

import json
from pathlib import Path

import pytest

from hybridtrace.errors import ConfigError, UnsupportedArchitecture
from hybridtrace.model import SizingOptions, byte_model_for, geometry_from_config, load_config, size_model

CONFIGS = Path(__file__).parent / "configs"


def sized(name: str, tp: int = 1, **options) -> object:
    return byte_model_for(name, SizingOptions(tp_size=tp, **options))


# --- NVIDIA Nemotron Nano 12B v2 (NemotronHForCausalLM) ---------------------------------
# 62 layers: pattern has 28 'M' (Mamba2), 6 '*' (attention), 28 '-' (MLP).
# attention: 8 KV heads, head_dim 128.  Mamba2: 128 heads x 80 = inner 10240, n_groups 8,
# state 128, kernel 4 → conv_dim = 10240 + 2*8*128 = 12288.


@pytest.mark.parametrize(
    ("tp", "attn_1tok", "conv", "ssm"),
    [
        # tp1: 8*256*2 = 4096; conv 3*12288*2 = 73728; ssm 128*80*128*2 = 2621440
        (1, 4096, 73728, 2621440),
        # tp2: 4*256*2 = 2048; conv 3*6144*2 = 36864; ssm 64*80*128*2 = 1310720
        (2, 2048, 36864, 1310720),
        # tp4: 2*256*2 = 1024; conv 3*3072*2 = 18432; ssm 32*80*128*2 = 655360
        (4, 1024, 18432, 655360),
        # tp8: 1*256*2 = 512; conv 3*1536*2 = 9216; ssm 16*80*128*2 = 327680
        (8, 512, 9216, 327680),
    ],
)
def test_nemotron_nano_12b_bf16(tp, attn_1tok, conv, ssm):
    m = sized("nemotron-nano-12b-v2", tp, kv_dtype="bfloat16", ssm_dtype="bfloat16")
    assert (m.attention_layers, m.recurrent_layers) == (6, 28)
    assert m.attention_bytes_per_token_per_layer == attn_1tok
    assert m.attention_bytes_per_token == 6 * attn_1tok
    assert (m.conv_bytes_per_layer, m.ssm_bytes_per_layer) == (conv, ssm)
    assert m.state_bytes == 28 * (conv + ssm)
    # page = conv + ssm scales with 1/tp like attn_1tok, so ceil((conv+ssm)/(16*attn_1tok)) =
    # ceil(41.125) = 42 at every tp → 672 tokens; pad = 42*16*attn - page = 2.13%
    assert m.block_tokens == 672
    assert m.attention_page_bytes == 672 * attn_1tok
    assert m.mamba_padding_pct == 2.13


def test_nemotron_nano_12b_contract_example():
    m = sized("nemotron-nano-12b-v2", 4, kv_dtype="bfloat16", ssm_dtype="bfloat16")
    assert m.attention_bytes_per_token == 6144
    assert (m.conv_bytes, m.ssm_bytes, m.state_bytes) == (516096, 18350080, 18866176)


def test_nemotron_nano_12b_seed_figures_are_per_layer():
    m = sized("nemotron-nano-12b-v2", 1, kv_dtype="bfloat16", ssm_dtype="bfloat16")
    assert m.attention_bytes_per_token_per_layer * 16 == 64 * 1024  # 64 KiB per 16-token block
    assert round(m.mamba_page_bytes / 2**20, 2) == 2.57  # one Mamba layer's state
    assert m.attention_bytes_per_token == 24 * 1024  # whole model: 6 layers
    assert round(m.state_bytes / 2**20, 2) == 71.97  # 28 layers x 2,695,168 B


def test_nemotron_ssm_state_defaults_to_float32():
    # vLLM's Nemotron-H config hook turns an auto SSM dtype into float32.
    m = sized("nemotron-nano-12b-v2")
    assert (m.kv_cache_dtype, m.mamba_cache_dtype, m.mamba_ssm_cache_dtype) == (
        "bfloat16",
        "bfloat16",
        "float32",
    )
    # ssm 128*80*128*4 = 5242880; page = 73728 + 5242880 = 5316608
    assert m.ssm_bytes_per_layer == 5242880
    assert m.mamba_page_bytes == 5316608
    # ceil(5316608 / 65536) = ceil(81.125) = 82 → 1312 tokens; pad 57344 / 5316608 = 1.08%
    assert m.block_tokens == 1312
    assert m.mamba_padding_pct == 1.08
    # --mamba-dtype sets the conv state only: the hook keeps the SSM state float32 while
    # --ssm-dtype is auto (vLLM's update_mamba_ssm_cache_dtype reads only that setting)
    conv_only = sized("nemotron-nano-12b-v2", mamba_dtype="float16")
    assert (conv_only.mamba_cache_dtype, conv_only.mamba_ssm_cache_dtype) == ("float16", "float32")
    both = sized("nemotron-nano-12b-v2", mamba_dtype="float16", ssm_dtype="float16")
    assert both.mamba_ssm_cache_dtype == "float16"
    # a family without a hook (Jamba): --mamba-dtype sets both states
    assert sized("jamba-v0.1", mamba_dtype="float32").mamba_ssm_cache_dtype == "float32"


def test_nemotron_fp8_kv_cache():
    # fp8 = 1 byte: 8*256*1 = 2048 per layer; ceil(2695168 / (16*2048)) = ceil(82.25) = 83
    m = sized("nemotron-nano-12b-v2", kv_dtype="fp8", ssm_dtype="bfloat16")
    assert m.attention_bytes_per_token == 6 * 2048
    assert m.block_tokens == 83 * 16 == 1328
    # pad = (1328*2048 - 2695168) / 2695168 = 24576 / 2695168 = 0.91%
    assert m.mamba_padding_pct == 0.91


def test_nemotron_groups_and_padding_layers():
    # 28 Mamba vs 6 attention: 28 >= 1.5*6 so groups of 6; ceil(28/6) = 5 Mamba groups
    # hold 30 slots: 2 padding layers, 2/28 = 7.14% as vLLM logs it.
    g = sized("nemotron-nano-12b-v2").kv_cache_groups
    assert (g.group_size, g.attention_groups, g.recurrent_groups, g.padding_layers, g.padding_pct) == (
        6,
        1,
        5,
        2,
        7.14,
    )


def test_nemotron_speculative_tokens_widen_conv_only():
    # conv (3+2) * 12288 * 2 = 122880; ssm unchanged
    m = sized("nemotron-nano-12b-v2", kv_dtype="bfloat16", ssm_dtype="bfloat16", num_spec_tokens=2)
    assert m.conv_bytes_per_layer == 122880
    assert m.ssm_bytes_per_layer == 2621440


def test_nemotron_tp16_cannot_shard():
    # 40 query heads on 16 ranks: vLLM refuses to build the model; so do we.
    with pytest.raises(ConfigError, match="attention heads = 40"):
        sized("nemotron-nano-12b-v2", 16)
    # and n_groups 8 is neither divisible by 16 nor 1
    geometry = geometry_from_config(load_config("nemotron-nano-12b-v2")[0])
    with pytest.raises(ConfigError, match="n_groups"):
        geometry.recurrent.shapes(16)


def test_block_align_and_prefix_caching_mode_all():
    # --block-align 64: 64 * ceil(2695168 / (64*4096)) = 64 * 11 = 704
    m = sized("nemotron-nano-12b-v2", kv_dtype="bfloat16", ssm_dtype="bfloat16", block_align=64)
    assert m.block_tokens == 704
    # mode all: chunk = lcm(128, 16) = 128; 128 * ceil(ceil(2695168/4096)=659 / 128) = 128 * 6 = 768
    m = sized("nemotron-nano-12b-v2", kv_dtype="bfloat16", ssm_dtype="bfloat16", mamba_cache_mode="all")
    assert m.block_tokens == 768


# --- NVIDIA Nemotron 3 Nano 30B-A3B (NemotronH MoE) -------------------------------------
# pattern of 52: 23 'M', 6 '*', 23 'E'. attention 2 KV heads x 128; Mamba2 64 heads x 64 =
# inner 4096, n_groups 8, state 128 → conv_dim 4096 + 2048 = 6144. Config sets fp32 SSM.


@pytest.mark.parametrize(
    ("tp", "attn_1tok", "conv", "ssm", "block", "pad"),
    [
        # 2*256*2 = 1024; 3*6144*2 = 36864; 64*64*128*2 = 1048576; page 1085440;
        # 16*ceil(1085440/16384 = 66.25) = 1072; (1072*1024 - 1085440)/1085440 = 1.13%
        (1, 1024, 36864, 1048576, 1072, 1.13),
        # 1 head: 512; 3*3072*2 = 18432; 32*64*128*2 = 524288; page 542720; ceil(66.25) → 1072
        (2, 512, 18432, 524288, 1072, 1.13),
        # 2 KV heads on 4 ranks: replicated, still 512; 9216 + 262144 = 271360;
        # 16*ceil(271360/8192 = 33.125) = 544; (544*512 - 271360)/271360 = 2.64%
        (4, 512, 9216, 262144, 544, 2.64),
        # 512; 4608 + 131072 = 135680; 16*ceil(16.5625) = 272; (139264-135680)/135680 = 2.64%
        (8, 512, 4608, 131072, 272, 2.64),
    ],
)
def test_nemotron_3_nano_30b_moe(tp, attn_1tok, conv, ssm, block, pad):
    m = sized("nemotron-3-nano-30b-a3b", tp, kv_dtype="bfloat16", ssm_dtype="bfloat16")
    assert (m.attention_layers, m.recurrent_layers) == (6, 23)
    assert m.attention_bytes_per_token == 6 * attn_1tok
    assert (m.conv_bytes_per_layer, m.ssm_bytes_per_layer) == (conv, ssm)
    assert (m.block_tokens, m.mamba_padding_pct) == (block, pad)


def test_nemotron_3_nano_30b_groups_match_vllm_log():
    # real vLLM log for this model: "Add 1 padding layers, may waste at most 4.35%"
    g = sized("nemotron-3-nano-30b-a3b").kv_cache_groups
    assert (g.group_size, g.recurrent_groups, g.padding_layers, g.padding_pct) == (6, 4, 1, 4.35)


def test_nemotron_3_nano_30b_config_sets_float32_ssm():
    # config.json says mamba_ssm_cache_dtype float32: 64*64*128*4 = 2097152
    m = sized("nemotron-3-nano-30b-a3b")
    assert m.mamba_ssm_cache_dtype == "float32"
    assert m.ssm_bytes_per_layer == 2097152


# --- Jamba v0.1 (Mamba1) ----------------------------------------------------------------
# 32 layers, attention where i % 8 == 4 → 4 attention, 28 Mamba. 8 KV heads, head 4096/32 = 128.
# Mamba1 inner = 2 * 4096 = 8192, state 16, kernel 4.


@pytest.mark.parametrize(
    ("tp", "attn_1tok", "conv", "ssm"),
    [
        (1, 4096, 3 * 8192 * 2, 8192 * 16 * 2),  # 49152 + 262144 = 311296
        (2, 2048, 3 * 4096 * 2, 4096 * 16 * 2),
        (4, 1024, 3 * 2048 * 2, 2048 * 16 * 2),
        (8, 512, 3 * 1024 * 2, 1024 * 16 * 2),
    ],
)
def test_jamba(tp, attn_1tok, conv, ssm):
    m = sized("jamba-v0.1", tp)
    assert (m.attention_layers, m.recurrent_layers, m.recurrent_kind) == (4, 28, "mamba1")
    assert m.attention_bytes_per_token == 4 * attn_1tok
    assert (m.conv_bytes_per_layer, m.ssm_bytes_per_layer) == (conv, ssm)
    assert m.state_bytes == 28 * (conv + ssm)
    # ceil(311296/tp / (16*4096/tp)) = ceil(4.75) = 5 → 80 tokens; (327680-311296)/311296 = 5.26%
    assert (m.block_tokens, m.mamba_padding_pct) == (80, 5.26)
    # Jamba's SSM state follows the model dtype (no family override)
    assert m.mamba_ssm_cache_dtype == "bfloat16"


def test_jamba_ignores_speculative_tokens_in_conv():
    assert sized("jamba-v0.1", num_spec_tokens=3).conv_bytes_per_layer == 3 * 8192 * 2


def test_jamba_groups():
    g = sized("jamba-v0.1").kv_cache_groups
    assert (g.group_size, g.attention_groups, g.recurrent_groups, g.padding_layers) == (4, 1, 7, 0)


# --- Qwen3-Next 80B-A3B (gated DeltaNet) ------------------------------------------------
# 48 layers: 12 full attention, 36 linear. attention 2 KV heads x 256.
# GDN: 16 k heads x 128, 32 v heads x 128, kernel 4 → conv_dim 2*16*128 + 32*128 = 8192.


@pytest.mark.parametrize(
    ("tp", "attn_1tok", "conv", "ssm", "block", "pad"),
    [
        # 2*512*2 = 2048; 3*8192*2 = 49152; 32*128*128*2 = 1048576; page 1097728;
        # 16*ceil(1097728/32768 = 33.5) = 544; (544*2048 - 1097728)/1097728 = 1.49%
        (1, 2048, 49152, 1048576, 544, 1.49),
        # 1 head: 1024; 24576 + 524288 = 548864; 16*ceil(33.5) = 544; 1.49%
        (2, 1024, 24576, 524288, 544, 1.49),
        # replicated head: 1024; 12288 + 262144 = 274432; 16*ceil(16.75) = 272; 1.49%
        (4, 1024, 12288, 262144, 272, 1.49),
        # 1024; 6144 + 131072 = 137216; 16*ceil(8.375) = 144; (147456-137216)/137216 = 7.46%
        (8, 1024, 6144, 131072, 144, 7.46),
    ],
)
def test_qwen3_next(tp, attn_1tok, conv, ssm, block, pad):
    m = sized("qwen3-next-80b-a3b-instruct", tp)
    assert (m.attention_layers, m.recurrent_layers, m.recurrent_kind) == (12, 36, "gated_delta_net")
    assert m.attention_bytes_per_token == 12 * attn_1tok
    assert (m.conv_bytes_per_layer, m.ssm_bytes_per_layer) == (conv, ssm)
    assert (m.block_tokens, m.mamba_padding_pct) == (block, pad)


def test_qwen3_next_kv_head_replication_noted():
    m = sized("qwen3-next-80b-a3b-instruct", 4)
    assert m.kv_heads_per_rank == 1
    assert any("replica" in note for note in m.notes)


# --- Mamba-Codestral 7B (pure Mamba2) and mamba-130m (pure Mamba1) ----------------------


def test_mamba2_codestral():
    # 64 layers; inner 2*4096 = 8192, 128 heads x 64, 8 groups, state 128
    # conv 3*(8192 + 2*8*128 = 10240)*2 = 61440; ssm 128*64*128*2 = 2097152
    m = sized("mamba-codestral-7b")
    assert (m.attention_layers, m.recurrent_layers) == (0, 64)
    assert m.attention_bytes_per_token == 0
    assert (m.conv_bytes_per_layer, m.ssm_bytes_per_layer) == (61440, 2097152)
    assert m.state_bytes == 64 * 2158592
    # no attention: no hybrid alignment, no padding (null, not 0)
    assert m.block_tokens is None and m.mamba_padding_pct is None


def test_mamba1_130m_float32_checkpoint_runs_bf16():
    # torch_dtype float32 → vLLM runs it in bfloat16 under --dtype auto
    # 24 layers; inner 1536, state 16: conv 3*1536*2 = 9216, ssm 1536*16*2 = 49152
    m = sized("mamba-130m")
    assert m.mamba_cache_dtype == "bfloat16"
    assert (m.conv_bytes_per_layer, m.ssm_bytes_per_layer) == (9216, 49152)
    assert m.state_bytes == 24 * 58368


# --- Zamba2 (shared attention blocks) ---------------------------------------------------


def test_zamba2_every_layer_has_state_hybrid_layers_have_kv():
    # Zamba2-7B: 81 layers, 13 'hybrid'. Shared attention: 32 heads (MHA), head 2*3584/32 = 224.
    # Mamba2: inner 2*3584 = 7168, 2 groups, state 64 (transformers defaults for absent keys).
    m = sized("zamba2-7b")
    assert (m.attention_layers, m.recurrent_layers) == (13, 81)
    # 32 * (224+224) * 2 = 28672 per layer
    assert m.attention_bytes_per_token_per_layer == 28672
    # conv 3*(7168 + 2*2*64)*2 = 44544; ssm = 7168*64*2 = 917504 (heads x head_dim = inner)
    assert (m.conv_bytes_per_layer, m.ssm_bytes_per_layer) == (44544, 917504)


# --- Falcon-H1, Granite 4.0-H, Bamba: real config excerpts (sizing keys only) ----------
# The excerpts in tests/configs carry the published values; keys they leave out take
# transformers' defaults, as they would in the config object vLLM sizes from.


def excerpt(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.excerpt.json").read_text())


def sized_excerpt(name: str, tp: int = 1, **options) -> object:
    return size_model(geometry_from_config(excerpt(name), name), SizingOptions(tp_size=tp, **options))


@pytest.mark.parametrize(
    ("tp", "attn_1tok", "conv", "ssm", "block", "pad"),
    [
        # 2 KV heads x 128: 2*256*2 = 1024; d_ssm 3072 = 24 heads x 128, 1 group, state 256:
        # conv 3*(3072 + 2*1*256 = 3584)*2 = 21504; ssm 24*128*256*2 = 1572864; page 1594368;
        # 16*ceil(1594368/16384 = 97.3) = 1568; (1568*1024 - 1594368)/1594368 = 0.71%
        (1, 1024, 21504, 1572864, 1568, 0.71),
        # 1 KV head: 512. 1 group on 2 ranks → replicated to 2 groups: conv_dim 3072 + 2*2*256
        # = 4096 / 2 = 2048 → conv 3*2048*2 = 12288; ssm 12*128*256*2 = 786432; page 798720;
        # 16*ceil(97.5) = 1568; (802816 - 798720)/798720 = 0.51%
        (2, 512, 12288, 786432, 1568, 0.51),
        # KV head replicated: 512; 4 groups: (3072 + 2048)/4 = 1280 → 7680; ssm 6*128*256*2 =
        # 393216; page 400896; 16*ceil(48.9) = 784; (401408 - 400896)/400896 = 0.13%
        (4, 512, 7680, 393216, 784, 0.13),
    ],
)
def test_falcon_h1_7b_every_layer_has_both_caches(tp, attn_1tok, conv, ssm, block, pad):
    m = sized_excerpt("falcon-h1-7b", tp)
    assert m.architecture == "FalconH1ForCausalLM"  # from model_type: the excerpt has no architectures
    assert m.attention_layers == m.recurrent_layers == 44
    assert m.attention_bytes_per_token == 44 * attn_1tok
    assert (m.conv_bytes_per_layer, m.ssm_bytes_per_layer) == (conv, ssm)
    assert (m.block_tokens, m.mamba_padding_pct) == (block, pad)
    # 44 and 44 layers: one group each, no padding layers
    assert (m.kv_cache_groups.group_size, m.kv_cache_groups.padding_layers) == (44, 0)


def test_falcon_h1_7b_tp8_refused():
    # 12 query heads do not split over 8 ranks
    with pytest.raises(ConfigError, match="attention heads = 12"):
        sized_excerpt("falcon-h1-7b", 8)


def test_falcon_h1_3b_tp1():
    # d_ssm 4096 = 32 x 128; conv 3*(4096 + 512)*2 = 27648; ssm 32*128*256*2 = 2097152;
    # page 2124800; 16*ceil(2124800/16384 = 129.7) = 2080; (2129920 - 2124800)/2124800 = 0.24%
    m = sized_excerpt("falcon-h1-3b")
    assert (m.conv_bytes_per_layer, m.ssm_bytes_per_layer, m.block_tokens, m.mamba_padding_pct) == (
        27648,
        2097152,
        2080,
        0.24,
    )


def test_falcon_h1_without_d_ssm_takes_transformers_default_and_is_refused():
    # The 0.5B excerpt lacks mamba_d_ssm, so transformers' default 1024 applies, which does
    # not equal 24 heads x 64: the config object would not even build. We say so.
    with pytest.raises(ConfigError, match="inconsistent"):
        geometry_from_config(excerpt("falcon-h1-0.5b"))


@pytest.mark.parametrize(
    ("tp", "attn_1tok", "conv", "ssm", "block", "pad"),
    [
        # 4 KV heads x 128 (1536/12): 4*256*2 = 2048; inner 3072 = 48 x 64, state 128:
        # conv 3*(3072 + 256)*2 = 19968; ssm 48*64*128*2 = 786432; page 806400;
        # 16*ceil(806400/32768 = 24.6) = 400; (819200 - 806400)/806400 = 1.59%
        (1, 2048, 19968, 786432, 400, 1.59),
        # 2 heads: 1024; groups 1→2: (3072 + 512)/2 = 1792 → 10752; ssm 393216; page 403968;
        # 16*ceil(24.66) = 400; (409600 - 403968)/403968 = 1.39%
        (2, 1024, 10752, 393216, 400, 1.39),
        # 1 head: 512; groups 4: (3072 + 1024)/4 = 1024 → 6144; ssm 196608; page 202752;
        # 16*ceil(24.75) = 400; (204800 - 202752)/202752 = 1.01%
        (4, 512, 6144, 196608, 400, 1.01),
    ],
)
def test_granite_4_h_tiny(tp, attn_1tok, conv, ssm, block, pad):
    m = sized_excerpt("granite-4.0-h-tiny", tp)
    assert m.architecture == "GraniteMoeHybridForCausalLM"
    assert (m.attention_layers, m.recurrent_layers) == (4, 36)
    assert m.attention_bytes_per_token == 4 * attn_1tok
    assert (m.conv_bytes_per_layer, m.ssm_bytes_per_layer) == (conv, ssm)
    assert (m.block_tokens, m.mamba_padding_pct) == (block, pad)


def test_granite_4_h_tiny_tp8_refused():
    # 12 query heads do not split over 8 ranks
    with pytest.raises(ConfigError, match="attention heads = 12"):
        sized_excerpt("granite-4.0-h-tiny", 8)


@pytest.mark.parametrize(
    ("tp", "attn_1tok", "conv", "ssm", "block", "pad"),
    [
        # excerpt: 32 layers, attention at 9/18/27, hidden 4096, 32 heads, state 128; the rest
        # are transformers' Bamba defaults: 8 KV heads, 128 Mamba heads, 1 group, kernel 4,
        # expand 2 → inner 8192, head_dim 64. 8*256*2 = 4096; conv 3*(8192+256)*2 = 50688;
        # ssm 128*64*128*2 = 2097152; page 2147840; 16*ceil(32.77) = 528;
        # (528*4096 - 2147840)/2147840 = 0.69%
        (1, 4096, 50688, 2097152, 528, 0.69),
        # groups 1→2: (8192 + 512)/2 = 4352 → 26112; ssm 1048576; page 1074688; 528; 0.62%
        (2, 2048, 26112, 1048576, 528, 0.62),
        # groups 4: (8192 + 1024)/4 = 2304 → 13824; ssm 524288; page 538112; 528; 0.48%
        (4, 1024, 13824, 524288, 528, 0.48),
        # groups 8: (8192 + 2048)/8 = 1280 → 7680; ssm 262144; page 269824; 528; 0.19%
        (8, 512, 7680, 262144, 528, 0.19),
    ],
)
def test_bamba_9b(tp, attn_1tok, conv, ssm, block, pad):
    m = sized_excerpt("bamba-9b", tp)
    assert (m.attention_layers, m.recurrent_layers) == (3, 29)
    assert m.attention_bytes_per_token == 3 * attn_1tok
    assert (m.conv_bytes_per_layer, m.ssm_bytes_per_layer) == (conv, ssm)
    assert (m.block_tokens, m.mamba_padding_pct) == (block, pad)


# --- pure attention control -------------------------------------------------------------


@pytest.mark.parametrize(("tp", "per_layer"), [(1, 4096), (2, 2048), (4, 1024), (8, 512)])
def test_llama_control_has_no_state(tp, per_layer):
    m = sized("llama-3-8b-instruct", tp)
    assert m.attention_bytes_per_token == 32 * per_layer  # 8 KV heads x 128 x 2 x 2 B / tp
    assert m.state_bytes == 0
    assert m.block_tokens == 16 and m.mamba_padding_pct is None
    assert m.kv_cache_groups is None


def test_float32_kv_cache():
    assert sized("llama-3-8b-instruct", kv_dtype="float32").attention_bytes_per_token == 32 * 8192


# --- bad input --------------------------------------------------------------------------


def test_unknown_architecture_names_it_and_the_supported_list():
    with pytest.raises(UnsupportedArchitecture) as info:
        geometry_from_config({"architectures": ["FancyNewForCausalLM"]})
    assert "FancyNewForCausalLM" in str(info.value)
    assert "NemotronHForCausalLM" in str(info.value)


def test_missing_key_is_a_clear_error():
    config, _ = load_config("jamba-v0.1")
    del config["mamba_d_state"]
    with pytest.raises(ConfigError, match="mamba_d_state"):
        geometry_from_config(config)


def test_inconsistent_mamba_width_is_refused():
    config = excerpt("falcon-h1-3b")
    config["mamba_n_heads"] = 20
    with pytest.raises(ConfigError, match="inconsistent"):
        geometry_from_config(config)


def test_state_dtype_cannot_be_fp8():
    from hybridtrace.errors import UsageError

    with pytest.raises(UsageError):
        size_model(geometry_from_config(load_config("jamba-v0.1")[0]), SizingOptions(ssm_dtype="fp8"))


def test_mode_all_is_align_where_vllm_has_no_mamba_prefix_caching():
    # vLLM turns mamba_cache_mode=all into align for a model class without
    # SupportsMambaPrefixCaching (Qwen3Next): no chunk alignment, and a note says why.
    # TP 2: 16 · cdiv(24,576 + 524,288, 16 · 1024) = 544 tokens, 1.49 % padding.
    every = sized("qwen3-next-80b-a3b-instruct", 2, mamba_cache_mode="all")
    align = sized("qwen3-next-80b-a3b-instruct", 2, mamba_cache_mode="align")
    assert (every.block_tokens, every.mamba_padding_pct) == (align.block_tokens, align.mamba_padding_pct)
    assert (every.block_tokens, every.mamba_padding_pct) == (544, 1.49)
    assert any("runs it as align" in note for note in every.notes)
    # Nemotron-H supports it: mode all still aligns to its Mamba chunk
    assert sized("nemotron-nano-12b-v2", mamba_cache_mode="all").block_tokens % 128 == 0
