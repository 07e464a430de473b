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


def _attention(config: Config, layers: int, *, head_size: int | None = None) -> AttentionGeometry | None:
    if layers == 0:
        return None
    heads = _int(config, "num_attention_heads")
    kv_heads = _int(config, "num_key_value_heads", default=heads)
    if head_size is None:
        explicit = config.get("head_dim")
        head_size = int(explicit) if explicit else _int(config, "hidden_size") // heads
    return AttentionGeometry(layers=layers, num_kv_heads=kv_heads, head_size=head_size, head_size_v=head_size)


def _chunk(config: Config) -> int | None:
    value = config.get("chunk_size") or config.get("mamba_chunk_size")
    return int(value) if value else None


# --- families ---------------------------------------------------------------------------


def _nemotron_h(config: Config) -> dict[str, Any]:
    pattern = _get(config, "hybrid_override_pattern")
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError("hybrid_override_pattern must be a non-empty string")
    # M = Mamba2 mixer, * = attention, - = MLP, E = MoE: only M and * hold caches.
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
        # vLLM keeps Nemotron-H's SSM state in float32 unless told otherwise.
        "ssm_dtype_default": "float32",
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
    return {"attention": _attention(config, attention), "recurrent": recurrent}


def _mamba2_from_prefixed(config: Config, layers: int) -> Mamba2Geometry:
    """Bamba / Granite-hybrid / Falcon-H1 style ``mamba_*`` keys."""
    hidden = _int(config, "hidden_size")
    d_ssm = config.get("mamba_d_ssm")
    intermediate = int(d_ssm) if d_ssm else _int(config, "mamba_expand") * hidden
    return Mamba2Geometry(
        layers=layers,
        intermediate_size=intermediate,
        n_groups=_int(config, "mamba_n_groups"),
        state_size=_int(config, "mamba_d_state"),
        num_heads=_int(config, "mamba_n_heads"),
        head_dim=_int(config, "mamba_d_head"),
        conv_kernel=_int(config, "mamba_d_conv"),
    )


def _granite_hybrid(config: Config) -> dict[str, Any]:
    layer_types = _get(config, "layer_types")
    attention = sum(1 for t in layer_types if t == "attention")
    mamba = sum(1 for t in layer_types if t == "mamba")
    if attention + mamba != len(layer_types):
        unknown = sorted({t for t in layer_types if t not in ("attention", "mamba")})
        raise ConfigError(f"layer_types has kinds the byte model does not know: {unknown}")
    return {
        "attention": _attention(config, attention),
        "recurrent": _mamba2_from_prefixed(config, mamba) if mamba else None,
    }


def _bamba(config: Config) -> dict[str, Any]:
    layers = _int(config, "num_hidden_layers")
    indices = _get(config, "attn_layer_indices", default=[])
    attention = len({int(i) for i in indices if 0 <= int(i) < layers})
    return {
        "attention": _attention(config, attention),
        "recurrent": _mamba2_from_prefixed(config, layers - attention),
    }


def _falcon_h1(config: Config) -> dict[str, Any]:
    # Parallel hybrid: every decoder layer runs attention and Mamba2 side by side,
    # so every layer keeps both a KV cache and a state.
    layers = _int(config, "num_hidden_layers")
    return {
        "attention": _attention(config, layers),
        "recurrent": _mamba2_from_prefixed(config, layers),
    }


def _zamba2(config: Config) -> dict[str, Any]:
    block_types = _get(config, "layers_block_type")
    layers = len(block_types)
    hybrid = sum(1 for t in block_types if t == "hybrid")
    hidden = _int(config, "hidden_size")
    heads = _int(config, "num_attention_heads")
    # The shared transformer block attends over [hidden, embeddings]: twice the width.
    attention_hidden = _int(config, "attention_hidden_size", default=2 * hidden)
    head_size = _int(config, "attention_head_dim", default=attention_hidden // heads)
    recurrent = Mamba2Geometry(
        layers=layers,  # every layer, hybrid or not, has its own Mamba2 mixer
        intermediate_size=_int(config, "mamba_expand") * hidden,
        n_groups=_int(config, "mamba_ngroups"),
        state_size=_int(config, "mamba_d_state"),
        num_heads=_int(config, "n_mamba_heads"),
        head_dim=_int(config, "mamba_headdim"),
        conv_kernel=_int(config, "mamba_d_conv"),
    )
    return {
        # Shared weights, but each hybrid layer keeps its own KV cache.
        "attention": _attention(config, hybrid, head_size=head_size),
        "recurrent": recurrent,
        "notes": ("Zamba2 shares attention weights across hybrid layers, not KV caches",),
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
    return {"attention": _attention(config, attention), "recurrent": recurrent}


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
    return {"attention": None, "recurrent": recurrent}


def _mamba1(config: Config) -> dict[str, Any]:
    recurrent = Mamba1Geometry(
        layers=_int(config, "num_hidden_layers"),
        intermediate_size=_int(config, "intermediate_size"),
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
    if not architectures:
        raise ConfigError("config.json has no 'architectures' entry, so its model family is unknown")
    architecture = str(architectures[0])
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
        mamba_chunk_size=_chunk(config),
        notes=tuple(parts.get("notes", ())),
    )
