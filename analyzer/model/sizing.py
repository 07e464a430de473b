"""vLLM's cache sizing rules applied to a model geometry: the per-rank byte model.

B (attention bytes per token) sums every full-attention layer a rank holds; S (state
bytes of one snapshot) sums conv + SSM over every recurrent layer. The hybrid allocator
then raises the attention block size until one attention page covers one Mamba page
and pads the Mamba page up to it; we reproduce both numbers as vLLM logs them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from hybridtrace.errors import UsageError
from hybridtrace.model import dtypes
from hybridtrace.model.geometry import ModelGeometry

MAMBA_CACHE_MODES = ("none", "align", "all")
DEFAULT_BLOCK_SIZE = 16  # vLLM's default --block-size on GPUs


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class SizingOptions:
    """How the engine is configured; mirrors vLLM's flags of the same names."""

    tp_size: int = 1
    kv_dtype: str = "auto"  # --kv-cache-dtype
    mamba_dtype: str = "auto"  # --mamba-cache-dtype: conv state (and SSM unless ssm_dtype is set)
    ssm_dtype: str = "auto"  # --mamba-ssm-cache-dtype
    mamba_cache_mode: str = "none"  # none | align | all (all = Mamba prefix caching)
    block_align: int = 16  # attention kernel block multiple
    num_spec_tokens: int = 0  # speculative tokens widen the conv state
    block_size: int = DEFAULT_BLOCK_SIZE  # the user's --block-size before hybrid alignment

    def validated(self) -> SizingOptions:
        if self.tp_size < 1:
            raise UsageError("--tp must be at least 1")
        if self.block_align < 1:
            raise UsageError("--block-align must be at least 1")
        if self.num_spec_tokens < 0:
            raise UsageError("--num-spec-tokens cannot be negative")
        if self.mamba_cache_mode not in MAMBA_CACHE_MODES:
            raise UsageError(f"--mamba-cache-mode must be one of {', '.join(MAMBA_CACHE_MODES)}")
        dtypes.check_kv_dtype(self.kv_dtype)
        dtypes.check_state_dtype(self.mamba_dtype, "--mamba-dtype")
        dtypes.check_state_dtype(self.ssm_dtype, "--ssm-dtype")
        return self


@dataclass(frozen=True)
class KVCacheGroups:
    """How the hybrid allocator groups layers: every group has ``group_size`` layer slots.

    Slots beyond a type's real layers are padding layers: they hold pages, and vLLM's
    connector reads every slot of a group, so they can cross the link too.
    """

    group_size: int
    attention_groups: int
    recurrent_groups: int
    padding_layers: int
    padding_pct: float  # as vLLM logs it: padding layers over the real layers of the padded type

    def as_dict(self) -> dict[str, int | float]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ByteModel:
    """Per-rank byte figures of one model at one TP size; the JSON of ``hybridtrace model``."""

    tp_size: int
    attention_layers: int | None  # None in raw mode: unknown, not zero
    recurrent_layers: int | None
    attention_bytes_per_token: int  # B
    conv_bytes: int | None
    ssm_bytes: int | None
    state_bytes: int  # S = conv + ssm
    block_tokens: int | None  # vLLM's (aligned) attention block size
    mamba_padding_pct: float | None
    model: str | None = None
    architecture: str | None = None
    source: str = "config"  # "config" | "raw"
    recurrent_kind: str | None = None
    kv_cache_dtype: str | None = None
    mamba_cache_dtype: str | None = None
    mamba_ssm_cache_dtype: str | None = None
    kv_heads_per_rank: int | None = None
    head_size: int | None = None
    attention_bytes_per_token_per_layer: int | None = None
    conv_shape: tuple[int, ...] | None = None
    ssm_shape: tuple[int, ...] | None = None
    conv_bytes_per_layer: int | None = None
    ssm_bytes_per_layer: int | None = None
    attention_page_bytes: int | None = None  # one layer, one block, one rank
    mamba_page_bytes: int | None = None  # one layer's state, unpadded
    mamba_padded_page_bytes: int | None = None  # what the allocator reserves per state block
    kv_cache_groups: KVCacheGroups | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def reserved_state_bytes(self) -> int:
        """Allocator bytes behind one state snapshot of all real recurrent layers (padded pages)."""
        if self.mamba_padded_page_bytes is None or not self.recurrent_layers:
            return self.state_bytes
        return self.mamba_padded_page_bytes * self.recurrent_layers

    def as_dict(self) -> dict:
        out = dict(self.__dict__)
        out["kv_cache_groups"] = self.kv_cache_groups.as_dict() if self.kv_cache_groups else None
        out["conv_shape"] = list(self.conv_shape) if self.conv_shape else None
        out["ssm_shape"] = list(self.ssm_shape) if self.ssm_shape else None
        out["notes"] = list(self.notes)
        return out


def resolve_dtypes(geometry: ModelGeometry, options: SizingOptions) -> tuple[str, str, str]:
    """(kv, conv, ssm) dtypes after ``auto`` is resolved the way vLLM resolves it."""
    kv = dtypes.canonical(options.kv_dtype)
    if kv == "auto":
        kv = geometry.model_dtype
    conv = dtypes.canonical(options.mamba_dtype)
    if conv == "auto":
        conv = geometry.model_dtype
    ssm = dtypes.canonical(options.ssm_dtype)
    if ssm == "auto":
        # --mamba-cache-dtype (or the model's dtype) sets both states, except where the
        # family's config hook (Nemotron-H) sets the SSM state's own dtype whenever
        # --mamba-ssm-cache-dtype is auto, whatever --mamba-cache-dtype says
        ssm = geometry.ssm_dtype_default if geometry.ssm_dtype_default != "auto" else conv
    return kv, conv, ssm


def aligned_block_tokens(
    attn_bytes_per_token_per_layer: int,
    mamba_page_bytes: int,
    options: SizingOptions,
    chunk_size: int,
) -> int:
    """The attention block size after vLLM's hybrid alignment.

    The alignment unit is the kernel block multiple, or the configured block size when
    that is larger. The block is the smallest multiple of it whose attention page covers
    one Mamba page (modes ``none`` and ``align``: ``align`` changes how many state blocks
    a request holds, not the page). Mode ``all`` (vLLM 0.22 and older, Mamba prefix
    caching at chunk granularity) makes the block a multiple of the Mamba chunk too.
    """
    unit = max(options.block_align, options.block_size)
    if options.mamba_cache_mode == "all":
        chunk = math.lcm(chunk_size, unit)
        aligned = chunk * _cdiv(_cdiv(mamba_page_bytes, attn_bytes_per_token_per_layer), chunk)
    else:
        aligned = unit * _cdiv(mamba_page_bytes, unit * attn_bytes_per_token_per_layer)
    # vLLM only ever raises the configured block size.
    return max(options.block_size, aligned)


def kv_cache_groups(attention_layers: int, recurrent_layers: int) -> KVCacheGroups | None:
    """Group layer counts the way vLLM's uniform-page-size grouping does."""
    counts = [n for n in (attention_layers, recurrent_layers) if n > 0]
    if len(counts) < 2:
        return None
    smallest, largest = min(counts), max(counts)
    # One group per type when the counts are close: padding the smaller type is cheaper
    # than splitting the larger one.
    group_size = largest if largest < smallest * 1.5 else smallest
    attention_groups = _cdiv(attention_layers, group_size)
    recurrent_groups = _cdiv(recurrent_layers, group_size)
    pad_attention = attention_groups * group_size - attention_layers
    pad_recurrent = recurrent_groups * group_size - recurrent_layers
    padding = pad_attention + pad_recurrent
    padded_real = (attention_layers if pad_attention else 0) + (recurrent_layers if pad_recurrent else 0)
    pct = 100.0 * padding / padded_real if padding else 0.0
    return KVCacheGroups(group_size, attention_groups, recurrent_groups, padding, round(pct, 2))


def size_model(geometry: ModelGeometry, options: SizingOptions | None = None) -> ByteModel:
    """The per-rank byte model of ``geometry`` under ``options``."""
    options = (options or SizingOptions()).validated()
    tp = options.tp_size
    kv_dtype, conv_dtype, ssm_dtype = resolve_dtypes(geometry, options)
    notes = list(geometry.notes)
    if options.mamba_cache_mode == "all" and not geometry.mamba_prefix_caching:
        options = replace(options, mamba_cache_mode="align")
        notes.append(
            "mamba_cache_mode all needs Mamba prefix caching, which vLLM's class for this model does not "
            "support: vLLM runs it as align"
        )

    attn_per_layer = 0
    kv_heads = head_size = None
    if geometry.attention:
        attn = geometry.attention
        attn.check_tp(tp)
        attn_per_layer = attn.bytes_per_token_per_layer(tp, dtypes.element_bytes(kv_dtype))
        kv_heads = attn.kv_heads_per_rank(tp)
        head_size = attn.head_size
        if attn.num_kv_heads < tp:
            notes.append(
                f"{attn.num_kv_heads} KV heads on TP {tp}: each rank keeps a replica of one head, "
                "so B per rank does not shrink beyond that"
            )
    conv_layer = ssm_layer = 0
    conv_shape = ssm_shape = None
    if geometry.recurrent:
        shapes = geometry.recurrent.shapes(tp, options.num_spec_tokens)
        conv_shape, ssm_shape = shapes.conv, shapes.ssm
        conv_layer = shapes.conv_elements * dtypes.element_bytes(conv_dtype)
        ssm_layer = shapes.ssm_elements * dtypes.element_bytes(ssm_dtype)
    mamba_page = conv_layer + ssm_layer

    block_tokens: int | None = None
    padding_pct: float | None = None
    attention_page = padded_page = None
    if attn_per_layer and mamba_page:
        block_tokens = aligned_block_tokens(attn_per_layer, mamba_page, options, geometry.mamba_chunk_size)
        attention_page = block_tokens * attn_per_layer
        padded_page = max(attention_page, mamba_page)
        padding_pct = round(100.0 * (padded_page - mamba_page) / mamba_page, 2)
    elif attn_per_layer:
        block_tokens = options.block_size
        attention_page = block_tokens * attn_per_layer

    return ByteModel(
        tp_size=tp,
        attention_layers=geometry.attention_layers,
        recurrent_layers=geometry.recurrent_layers,
        attention_bytes_per_token=attn_per_layer * geometry.attention_layers,
        conv_bytes=conv_layer * geometry.recurrent_layers,
        ssm_bytes=ssm_layer * geometry.recurrent_layers,
        state_bytes=mamba_page * geometry.recurrent_layers,
        block_tokens=block_tokens,
        mamba_padding_pct=padding_pct,
        model=geometry.name,
        architecture=geometry.architecture,
        source="config",
        recurrent_kind=geometry.recurrent.kind if geometry.recurrent else None,
        kv_cache_dtype=kv_dtype if geometry.attention else None,
        mamba_cache_dtype=conv_dtype if geometry.recurrent else None,
        mamba_ssm_cache_dtype=ssm_dtype if geometry.recurrent else None,
        kv_heads_per_rank=kv_heads,
        head_size=head_size,
        attention_bytes_per_token_per_layer=attn_per_layer or None,
        conv_shape=conv_shape,
        ssm_shape=ssm_shape,
        conv_bytes_per_layer=conv_layer if geometry.recurrent else None,
        ssm_bytes_per_layer=ssm_layer if geometry.recurrent else None,
        attention_page_bytes=attention_page,
        mamba_page_bytes=mamba_page or None,
        mamba_padded_page_bytes=padded_page,
        kv_cache_groups=kv_cache_groups(geometry.attention_layers, geometry.recurrent_layers),
        notes=tuple(notes),
    )


def raw_byte_model(attention_bytes_per_token: int, state_bytes: int, tp_size: int = 1) -> ByteModel:
    """A byte model from B and S given directly (per rank), with no config behind it."""
    if attention_bytes_per_token < 0 or state_bytes < 0:
        raise UsageError("B and S cannot be negative")
    if attention_bytes_per_token == 0 and state_bytes == 0:
        raise UsageError("give --attention-bytes-per-token, --state-bytes, or both")
    return ByteModel(
        tp_size=tp_size,
        attention_layers=None,
        recurrent_layers=None,
        attention_bytes_per_token=attention_bytes_per_token,
        conv_bytes=None,
        ssm_bytes=None,
        state_bytes=state_bytes,
        block_tokens=None,
        mamba_padding_pct=None,
        source="raw",
        notes=("raw mode: B and S as given, per rank; no block size or padding without a config",),
    )
