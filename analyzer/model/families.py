"""Read a Hugging Face config.json into a ``ModelGeometry``, one function per family.

Each family names its layers and state dimensions differently; the functions below
read exactly the keys vLLM's model class reads for cache sizing, so a config that
vLLM would size one way is sized the same way here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hybridtrace.errors import ConfigError, UnsupportedArchitecture
from hybridtrace.model import dtypes
from hybridtrace.model.geometry import (
    AttentionGeometry,
    GatedDeltaNetGeometry,
    Mamba1Geometry,
    Mamba2Geometry,
    ModelGeometry,
)

Config = Mapping[str, Any]


def _get(config: Config, *keys: str, default: Any = None, required: bool = True) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    if default is not None or not required:
        return default
    raise ConfigError(f"config.json has none of {', '.join(repr(k) for k in keys)}")


def _int(config: Config, *keys: str, default: int | None = None) -> int:
    value = _get(config, *keys, default=default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise ConfigError(f"config.json key {keys[0]!r} must be a whole number, got {value!r}")
    return int(value)


def model_dtype(config: Config) -> str:
    """The dtype vLLM runs the weights in for ``--dtype auto``.

    vLLM takes the config's ``torch_dtype`` (``dtype`` in newer configs) and runs float32
    checkpoints in bfloat16, as it does for a config that names no dtype.
    """
    raw = config.get("torch_dtype") or config.get("dtype") or "float32"
    try:
        resolved = dtypes.canonical(str(raw))
    except Exception as exc:
        raise ConfigError(f"config.json names an unknown dtype {raw!r}") from exc
    return "bfloat16" if resolved in ("float32", "auto") else resolved


def _attention(
    config: Config,
    layers: int,
    *,
    head_size: int | None = None,
    use_head_dim: bool = True,
    kv_heads: int | None = None,
) -> AttentionGeometry | None:
    """Attention geometry; ``use_head_dim=False`` for families whose vLLM code ignores head_dim."""
    if layers == 0:
        return None
    heads = _int(config, "num_attention_heads")
    if kv_heads is None:
        kv_heads = _int(config, "num_key_value_heads", default=heads)
    if head_size is None:
        explicit = config.get("head_dim") if use_head_dim else None
        head_size = int(explicit) if explicit else _int(config, "hidden_size") // heads
    return AttentionGeometry(
        layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_size=head_size, head_size_v=head_size
    )


def _chunk(config: Config, family_default: int | None) -> int:
    # vLLM's get_mamba_chunk_size: mamba_chunk_size, then chunk_size, then 2048. The
    # family default stands in for the value transformers fills in when the key is absent.
    value = config.get("mamba_chunk_size") or config.get("chunk_size") or family_default
    return int(value) if value else 2048


# --- families ---------------------------------------------------------------------------


def _nemotron_h(config: Config) -> dict[str, Any]:
    pattern = _get(config, "hybrid_override_pattern")
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError("hybrid_override_pattern must be a non-empty string")
    # M = Mamba2 mixer, * = attention, - = MLP, E = MoE: only M and * hold caches.
    unknown = sorted(set(pattern) - set("M*-E"))
    if unknown:
        raise ConfigError(f"hybrid_override_pattern has layer kinds the byte model does not know: {unknown}")
    mamba = pattern.count("M")
    attention = pattern.count("*")
    heads = _int(config, "mamba_num_heads")
    head_dim = _int(config, "mamba_head_dim")
    recurrent = Mamba2Geometry(
        layers=mamba,
        intermediate_size=heads * head_dim,
        n_groups=_int(config, "n_groups"),
        state_size=_int(config, "ssm_state_size"),
        num_heads=heads,
        head_dim=head_dim,
        conv_kernel=_int(config, "conv_kernel"),
    )
    return {
        "attention": _attention(config, attention),
        "recurrent": recurrent if mamba else None,
        # vLLM keeps Nemotron-H's SSM state in float32 unless told otherwise (or the
        # config's own mamba_ssm_cache_dtype says something else).
        "ssm_dtype_default": dtypes.canonical(str(config.get("mamba_ssm_cache_dtype") or "float32")),
        "chunk_default": 128,
    }


def _jamba(config: Config) -> dict[str, Any]:
    layers = _int(config, "num_hidden_layers")
    period = _int(config, "attn_layer_period")
    offset = _int(config, "attn_layer_offset")
    attention = sum(1 for i in range(layers) if i % period == offset)
    recurrent = Mamba1Geometry(
        layers=layers - attention,
        intermediate_size=_int(config, "mamba_expand") * _int(config, "hidden_size"),
        state_size=_int(config, "mamba_d_state"),
        conv_kernel=_int(config, "mamba_d_conv"),
    )
    # vLLM's Jamba attention uses hidden_size // heads whatever head_dim says.
    return {"attention": _attention(config, attention, use_head_dim=False), "recurrent": recurrent}


def _mamba2_from_prefixed(config: Config, layers: int) -> Mamba2Geometry:
    """Bamba / Granite-hybrid / Falcon-H1 style ``mamba_*`` keys."""
    hidden = _int(config, "hidden_size")
    d_ssm = config.get("mamba_d_ssm")
    intermediate = int(d_ssm) if d_ssm else int(_get(config, "mamba_expand") * hidden)
    heads = _int(config, "mamba_n_heads")
    # transformers writes "auto" for a head dim it derives from the inner width.
    if config.get("mamba_d_head") in (None, "auto"):
        head_dim = intermediate // heads
    else:
        head_dim = _int(config, "mamba_d_head")
    if heads * head_dim != intermediate:
        raise ConfigError(
            f"mamba_n_heads ({heads}) x mamba_d_head ({head_dim}) != Mamba inner width ({intermediate}): "
            "the config is inconsistent (is mamba_d_ssm missing?)"
        )
    return Mamba2Geometry(
        layers=layers,
        intermediate_size=intermediate,
        n_groups=_int(config, "mamba_n_groups"),
        state_size=_int(config, "mamba_d_state"),
        num_heads=heads,
        head_dim=head_dim,
        conv_kernel=_int(config, "mamba_d_conv"),
    )


def _granite_hybrid(config: Config) -> dict[str, Any]:
    # Older configs say attention/mamba, transformers 5 full_attention/linear_attention.
    layer_types = _get(config, "layer_types")
    attention = sum(1 for t in layer_types if t in ("attention", "full_attention"))
    mamba = sum(1 for t in layer_types if t in ("mamba", "linear_attention"))
    if attention + mamba != len(layer_types):
        unknown = sorted({t for t in layer_types if t not in _ATTN_OR_MAMBA})
        raise ConfigError(f"layer_types has kinds the byte model does not know: {unknown}")
    return {
        "attention": _attention(config, attention, use_head_dim=False),
        "recurrent": _mamba2_from_prefixed(config, mamba) if mamba else None,
        "chunk_default": 256,
    }


_ATTN_OR_MAMBA = frozenset({"attention", "full_attention", "mamba", "linear_attention"})


def _bamba(config: Config) -> dict[str, Any]:
    layers = _int(config, "num_hidden_layers")
    indices = _get(config, "attn_layer_indices", default=[])
    attention = len({int(i) for i in indices if 0 <= int(i) < layers})
    return {
        "attention": _attention(config, attention, use_head_dim=False),
        "recurrent": _mamba2_from_prefixed(config, layers - attention),
        "chunk_default": 256,
    }


def _falcon_h1(config: Config) -> dict[str, Any]:
    # Parallel hybrid: every decoder layer runs attention and Mamba2 side by side,
    # so every layer keeps both a KV cache and a state.
    layers = _int(config, "num_hidden_layers")
    return {
        "attention": _attention(config, layers),
        "recurrent": _mamba2_from_prefixed(config, layers),
        "chunk_default": 256,
    }


def _zamba2(config: Config) -> dict[str, Any]:
    # transformers' Zamba2Config fills absent mamba_* keys with its defaults and always
    # derives the Mamba head dim from the inner width; vLLM sizes from that object.
    block_types = _get(config, "layers_block_type")
    layers = len(block_types)
    hybrid = sum(1 for t in block_types if t == "hybrid")
    hidden = _int(config, "hidden_size")
    heads = _int(config, "num_attention_heads")
    intermediate = int(_get(config, "mamba_expand", default=2) * hidden)
    mamba_heads = _int(config, "n_mamba_heads", default=8)
    recurrent = Mamba2Geometry(
        layers=layers,  # every layer, hybrid or not, has its own Mamba2 mixer
        intermediate_size=intermediate,
        n_groups=_int(config, "mamba_ngroups", default=1),
        state_size=_int(config, "mamba_d_state", default=64),
        num_heads=mamba_heads,
        head_dim=intermediate // mamba_heads,
        conv_kernel=_int(config, "mamba_d_conv", default=4),
    )
    return {
        # Shared weights, but each hybrid layer keeps its own KV cache. The shared block
        # attends over [hidden, embeddings], so its head is 2·hidden/heads wide, and vLLM
        # builds it with as many KV heads as query heads.
        "attention": _attention(config, hybrid, head_size=2 * hidden // heads, kv_heads=heads),
        "recurrent": recurrent,
        "notes": ("Zamba2 shares attention weights across hybrid layers, not KV caches",),
        "chunk_default": 256,
    }


def _qwen3_next(config: Config) -> dict[str, Any]:
    layers = _int(config, "num_hidden_layers")
    layer_types = config.get("layer_types")
    if layer_types:
        attention = sum(1 for t in layer_types if t == "full_attention")
        linear = sum(1 for t in layer_types if t == "linear_attention")
    else:
        interval = _int(config, "full_attention_interval")
        attention = sum(1 for i in range(layers) if (i + 1) % interval == 0)
        linear = layers - attention
    recurrent = GatedDeltaNetGeometry(
        layers=linear,
        num_k_heads=_int(config, "linear_num_key_heads"),
        num_v_heads=_int(config, "linear_num_value_heads"),
        head_k_dim=_int(config, "linear_key_head_dim"),
        head_v_dim=_int(config, "linear_value_head_dim"),
        conv_kernel=_int(config, "linear_conv_kernel_dim"),
    )
    # vLLM's Qwen3Next class does not declare SupportsMambaPrefixCaching
    return {"attention": _attention(config, attention), "recurrent": recurrent, "mamba_prefix_caching": False}


def _mamba2(config: Config) -> dict[str, Any]:
    hidden = _int(config, "hidden_size")
    recurrent = Mamba2Geometry(
        layers=_int(config, "num_hidden_layers"),
        intermediate_size=_int(config, "expand") * hidden,
        n_groups=_int(config, "n_groups"),
        state_size=_int(config, "state_size"),
        num_heads=_int(config, "num_heads"),
        head_dim=_int(config, "head_dim"),
        conv_kernel=_int(config, "conv_kernel"),
    )
    return {"attention": None, "recurrent": recurrent, "chunk_default": 256}


def _mamba1(config: Config) -> dict[str, Any]:
    hidden = _int(config, "hidden_size")
    recurrent = Mamba1Geometry(
        layers=_int(config, "num_hidden_layers"),
        intermediate_size=_int(
            config, "intermediate_size", default=int(_get(config, "expand", default=2) * hidden)
        ),
        state_size=_int(config, "state_size"),
        conv_kernel=_int(config, "conv_kernel"),
    )
    return {"attention": None, "recurrent": recurrent}


def _dense_attention(config: Config) -> dict[str, Any]:
    return {"attention": _attention(config, _int(config, "num_hidden_layers")), "recurrent": None}


HYBRID_FAMILIES: dict[str, Callable[[Config], dict[str, Any]]] = {
    "NemotronHForCausalLM": _nemotron_h,
    "JambaForCausalLM": _jamba,
    "FalconH1ForCausalLM": _falcon_h1,
    "GraniteMoeHybridForCausalLM": _granite_hybrid,
    "BambaForCausalLM": _bamba,
    "Zamba2ForCausalLM": _zamba2,
    "Qwen3NextForCausalLM": _qwen3_next,
    "Mamba2ForCausalLM": _mamba2,
    "MambaForCausalLM": _mamba1,
    "FalconMambaForCausalLM": _mamba1,
}

# Keys transformers fills in when a config leaves them out; vLLM sizes from the filled-in
# object, so an absent key means this value, not an error.
_MAMBA_PREFIXED_DEFAULTS: dict[str, Any] = {
    "mamba_n_heads": 128,
    "mamba_d_head": "auto",
    "mamba_n_groups": 1,
    "mamba_d_state": 256,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
}
_TRANSFORMERS_DEFAULTS: dict[str, dict[str, Any]] = {
    "BambaForCausalLM": {**_MAMBA_PREFIXED_DEFAULTS, "num_key_value_heads": 8},
    "GraniteMoeHybridForCausalLM": dict(_MAMBA_PREFIXED_DEFAULTS),
    "FalconH1ForCausalLM": {**_MAMBA_PREFIXED_DEFAULTS, "num_key_value_heads": 8, "mamba_d_ssm": 1024},
}

# Configs without an "architectures" entry name their family by model_type.
_MODEL_TYPES: dict[str, str] = {
    "nemotron_h": "NemotronHForCausalLM",
    "jamba": "JambaForCausalLM",
    "falcon_h1": "FalconH1ForCausalLM",
    "granitemoehybrid": "GraniteMoeHybridForCausalLM",
    "bamba": "BambaForCausalLM",
    "zamba2": "Zamba2ForCausalLM",
    "qwen3_next": "Qwen3NextForCausalLM",
    "mamba2": "Mamba2ForCausalLM",
    "mamba": "MambaForCausalLM",
    "falcon_mamba": "FalconMambaForCausalLM",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}

# Decoders whose every layer is full attention with the standard config keys.
DENSE_ATTENTION = frozenset(
    {
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "MixtralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen2MoeForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "GraniteForCausalLM",
        "GraniteMoeForCausalLM",
        "PhiForCausalLM",
        "Phi3ForCausalLM",
        "InternLM2ForCausalLM",
        "OlmoForCausalLM",
        "Olmo2ForCausalLM",
        "GemmaForCausalLM",
        "StableLmForCausalLM",
        "Starcoder2ForCausalLM",
        "NemotronForCausalLM",
        "ExaoneForCausalLM",
    }
)


def supported_architectures() -> list[str]:
    return sorted(HYBRID_FAMILIES) + sorted(DENSE_ATTENTION)


def geometry_from_config(config: Config, name: str | None = None) -> ModelGeometry:
    """The layer geometry of the model that ``config`` describes."""
    if not isinstance(config, Mapping):
        raise ConfigError("config.json must hold a JSON object")
    if isinstance(config.get("text_config"), Mapping) and not config.get("num_hidden_layers"):
        # Multimodal wrappers keep the language model's config one level down.
        merged = dict(config["text_config"])
        merged.setdefault("architectures", config.get("architectures"))
        config = merged
    architectures = config.get("architectures") or []
    if architectures:
        architecture = str(architectures[0])
    elif config.get("model_type") in _MODEL_TYPES:
        architecture = _MODEL_TYPES[config["model_type"]]
    else:
        raise ConfigError(
            "config.json names no 'architectures' and no known model_type, so its family is unknown"
        )
    if architecture in _TRANSFORMERS_DEFAULTS:
        config = {**_TRANSFORMERS_DEFAULTS[architecture], **config}
    parser = HYBRID_FAMILIES.get(architecture)
    if parser is None and architecture in DENSE_ATTENTION:
        parser = _dense_attention
    if parser is None:
        raise UnsupportedArchitecture(
            f"unsupported architecture {architecture!r}; supported: {', '.join(supported_architectures())}"
        )
    parts = parser(config)
    if not parts.get("attention") and not parts.get("recurrent"):
        raise ConfigError(f"{architecture}: the config describes no attention and no recurrent layers")
    return ModelGeometry(
        name=name or config.get("_name_or_path") or None,
        architecture=architecture,
        model_type=config.get("model_type"),
        model_dtype=model_dtype(config),
        attention=parts.get("attention"),
        recurrent=parts.get("recurrent"),
        ssm_dtype_default=parts.get("ssm_dtype_default", "auto"),
        mamba_chunk_size=_chunk(config, parts.get("chunk_default")),
        mamba_prefix_caching=parts.get("mamba_prefix_caching", True),
        notes=tuple(parts.get("notes", ())),
    )
