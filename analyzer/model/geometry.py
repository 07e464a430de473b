"""Layer geometry of a model and the per-rank cache shapes vLLM derives from it.

A family parser (``families.py``) reads a Hugging Face config into a ``ModelGeometry``;
everything here is arithmetic on that geometry for one tensor-parallel size. The shape
rules mirror vLLM's ``MambaStateShapeCalculator`` and attention specs: a state
dimension that vLLM shards with ``divide()`` must divide evenly, and we refuse a TP size
vLLM itself would refuse rather than print a number it would never allocate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hybridtrace.errors import ConfigError


def _divide(numerator: int, tp_size: int, what: str) -> int:
    if numerator % tp_size:
        raise ConfigError(f"{what} = {numerator} is not divisible by TP {tp_size}; vLLM cannot shard it")
    return numerator // tp_size


@dataclass(frozen=True)
class AttentionGeometry:
    """Full-attention layers that keep a per-token K and V cache."""

    layers: int
    num_heads: int  # query heads, total
    num_kv_heads: int  # total across ranks, as in the config
    head_size: int
    head_size_v: int

    def check_tp(self, tp_size: int) -> None:
        _divide(self.num_heads, tp_size, "attention heads")
        if self.num_kv_heads % tp_size and tp_size % self.num_kv_heads:
            raise ConfigError(
                f"{self.num_kv_heads} KV heads on TP {tp_size}: neither divides the other, "
                "so vLLM cannot shard them"
            )

    def kv_heads_per_rank(self, tp_size: int) -> int:
        # vLLM replicates KV heads when there are fewer than ranks: every rank keeps at least one.
        return max(1, self.num_kv_heads // tp_size)

    def bytes_per_token_per_layer(self, tp_size: int, dtype_bytes: int) -> int:
        return self.kv_heads_per_rank(tp_size) * (self.head_size + self.head_size_v) * dtype_bytes


@dataclass(frozen=True)
class StateShapes:
    """One recurrent layer's cache tensors on one rank: (conv shape, temporal/SSM shape)."""

    conv: tuple[int, ...]
    ssm: tuple[int, ...]

    @property
    def conv_elements(self) -> int:
        return math.prod(self.conv)

    @property
    def ssm_elements(self) -> int:
        return math.prod(self.ssm)


@dataclass(frozen=True)
class Mamba1Geometry:
    layers: int
    intermediate_size: int
    state_size: int
    conv_kernel: int
    kind: str = field(default="mamba1", init=False)

    def shapes(self, tp_size: int, num_spec_tokens: int = 0) -> StateShapes:
        # vLLM does not widen the Mamba1 conv state for speculative tokens.
        inner = _divide(self.intermediate_size, tp_size, "mamba intermediate size")
        return StateShapes(conv=(self.conv_kernel - 1, inner), ssm=(inner, self.state_size))


def extra_groups_for_head_shards(n_groups: int, tp_size: int) -> int:
    """Groups vLLM adds so each rank holds whole B/C groups when n_groups % TP != 0."""
    if n_groups % tp_size == 0:
        return 0
    # vLLM only supports replicating a single group; larger uneven counts do not shard.
    return tp_size - n_groups


@dataclass(frozen=True)
class Mamba2Geometry:
    layers: int
    intermediate_size: int
    n_groups: int
    state_size: int
    num_heads: int
    head_dim: int
    conv_kernel: int
    kind: str = field(default="mamba2", init=False)

    def shapes(self, tp_size: int, num_spec_tokens: int = 0) -> StateShapes:
        if self.n_groups % tp_size and self.n_groups != 1:
            raise ConfigError(
                f"n_groups = {self.n_groups} is neither divisible by TP {tp_size} nor 1; "
                "vLLM cannot shard the Mamba2 B/C groups"
            )
        groups = self.n_groups + extra_groups_for_head_shards(self.n_groups, tp_size)
        conv_dim = self.intermediate_size + 2 * groups * self.state_size
        conv = (self.conv_kernel - 1 + num_spec_tokens, _divide(conv_dim, tp_size, "mamba conv dim"))
        ssm = (_divide(self.num_heads, tp_size, "mamba heads"), self.head_dim, self.state_size)
        return StateShapes(conv=conv, ssm=ssm)


@dataclass(frozen=True)
class GatedDeltaNetGeometry:
    layers: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    kind: str = field(default="gated_delta_net", init=False)

    def shapes(self, tp_size: int, num_spec_tokens: int = 0) -> StateShapes:
        conv_dim = self.head_k_dim * self.num_k_heads * 2 + self.head_v_dim * self.num_v_heads
        conv = (
            self.conv_kernel - 1 + num_spec_tokens,
            _divide(conv_dim, tp_size, "linear-attention conv dim"),
        )
        ssm = (
            _divide(self.num_v_heads, tp_size, "linear-attention value heads"),
            self.head_v_dim,
            self.head_k_dim,
        )
        return StateShapes(conv=conv, ssm=ssm)


RecurrentGeometry = Mamba1Geometry | Mamba2Geometry | GatedDeltaNetGeometry


@dataclass(frozen=True)
class ModelGeometry:
    """What the byte model needs to know about one model, independent of TP and dtypes."""

    name: str | None
    architecture: str
    model_type: str | None
    model_dtype: str  # resolved dtype vLLM would run the weights in ("auto" resolved)
    attention: AttentionGeometry | None
    recurrent: RecurrentGeometry | None
    # vLLM's family default for the SSM state when --mamba-ssm-cache-dtype is auto
    # ("auto" here means: follow the conv-state dtype).
    ssm_dtype_default: str = "auto"
    # Mamba chunk for mamba_cache_mode=all (mamba_chunk_size, else chunk_size, else
    # the family's transformers default, else vLLM's 2048).
    mamba_chunk_size: int = 2048
    # whether vLLM's model class supports Mamba prefix caching (SupportsMambaPrefixCaching):
    # without it, vLLM turns mamba_cache_mode=all into align
    mamba_prefix_caching: bool = True
    notes: tuple[str, ...] = ()

    @property
    def attention_layers(self) -> int:
        return self.attention.layers if self.attention else 0

    @property
    def recurrent_layers(self) -> int:
        return self.recurrent.layers if self.recurrent else 0
