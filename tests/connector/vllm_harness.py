"""Drive real vLLM 0.33 NIXL connectors over real NIXL inside one CPU-only process.

A :class:`Pair` is a prefill engine and a decode engine, each made of the two halves a
vLLM engine would hold: a WORKER-role connector (owning registered KV-cache tensors)
and a SCHEDULER-role connector (building the worker's metadata from ``Request``
objects). What an engine builds, vLLM builds here too:

* the KV-cache groups, the shared allocation and the per-layer views come from vLLM's
  own planning (``get_global_kv_cache_groups``, ``get_kv_cache_configs``,
  ``allocate_kv_cache``) applied to the specs the model's layers would report (the
  specs themselves are made as those layers make them, from the model class's
  state-shape functions, since no model is instantiated);
* the block sizes are set the way the engine sets them
  (``update_block_size_for_backend``, which aligns hybrid attention and Mamba pages);
* the KV-cache layout is resolved from the backends' supported layouts;
* the worker metadata is produced by the scheduler-side connector
  (``on_new_request``, ``get_num_new_matched_tokens``, ``update_state_after_alloc``,
  ``request_finished_all_groups``, ``build_connector_meta``);
* the decode worker handshakes with the prefill over vLLM's own side channel (a ZMQ
  socket on loopback, served by the prefill's scheduler-side connector after the
  worker's handshake metadata is handed to it, as the engine core does);
* the bytes cross over NIXL (UCX over TCP on loopback).

The harness stands in for the rest of an engine: a per-engine block pool in place of
the KV-cache manager (which block ids a request gets), the engine step loop, the
forward pass (random bytes written into the prefill's blocks) and a few lookups the
worker makes of a running engine (see ``_single_process_worker_patches``).

Environment: ``VLLM_TARGET_DEVICE=cpu``, ``VLLM_SSM_CONV_STATE_LAYOUT=DS`` and
``UCX_TLS=tcp,self`` must be set before vLLM is imported; importing this module first
sets them (without overriding values already set).

Typical use::

    pair = make_pair("hybrid")
    result = pair.transfer("req-0", num_tokens=100)
    assert result.ok and pair.decode_matches(result)
    assert result.nixl_bytes == expected_read_bytes(pair, result.decode_blocks)
    pair.close()
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

# These are read when vLLM / NIXL initialise, so they must precede the imports below.
# This machine has no accelerator, and vLLM would otherwise guess from torch's build.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
# The NIXL worker reads Mamba conv state in three sub-projection pieces, which needs
# the dim-first conv layout; without it the worker refuses to start.
os.environ.setdefault("VLLM_SSM_CONV_STATE_LAYOUT", "DS")
# Loopback NIXL works over UCX's TCP transport; shared memory ("shm") did not here.
os.environ.setdefault("UCX_TLS", "tcp,self")
# NIXL warns on import when this is unset; the value is the one it asks for.
os.environ.setdefault("UCX_RCACHE_MAX_UNRELEASED", "1024")

import torch
from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import (
    NixlConnector,
    NixlConnectorMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import (
    base_worker as nixl_base_worker,
)
from vllm.platforms import current_platform
from vllm.sampling_params import SamplingParams
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
from vllm.v1.attention.backends.utils import (
    get_supported_kv_cache_layouts,
    resolve_kv_cache_layout,
)
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_planning import (
    get_global_kv_cache_groups,
    get_kv_cache_configs,
)
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
from vllm.v1.kv_cache_interface import (
    AttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheSpec,
    MambaSpec,
)
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.worker.utils import allocate_kv_cache

Kind = Literal["attention", "hybrid"]
# Block ids of one request, one list per KV-cache group, in kv_cache_config.kv_cache_groups
# order (for the hybrid model the Mamba group comes first). Mixing up the order makes
# NIXL move the wrong blocks without any error, so every helper here keeps it.
BlockIds = tuple[list[int], ...]

PREFILL_ENGINE_ID = "prefill-0"
DECODE_ENGINE_ID = "decode-0"
# Whatever the decode's blocks held before a read; the Mamba page padding must still
# hold it afterwards, which shows the padding did not cross.
DECODE_SENTINEL_BYTE = 0x5A
# The CPU attention kernel takes blocks in multiples of 32 tokens; the hybrid model's
# alignment then raises its attention block to 64 so one page holds the Mamba state.
DEFAULT_BLOCK_SIZE = 32
DEFAULT_MAX_MODEL_LEN = 256
DEFAULT_TIMEOUT_S = 20.0

_BASE_WORKER_LOGGER = nixl_base_worker.__name__

# Tiny models: only their shapes matter, no weights are ever loaded.
_MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    "attention": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_hidden_layers": 2,
        "vocab_size": 256,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    },
    "hybrid": {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_hidden_layers": 4,
        "hybrid_override_pattern": "M*M*",
        "mamba_num_heads": 4,
        "mamba_head_dim": 16,
        "ssm_state_size": 16,
        "conv_kernel": 4,
        "n_groups": 1,
        "expand": 1,
        "chunk_size": 64,
        "vocab_size": 256,
        "max_position_embeddings": 1024,
        "layer_norm_epsilon": 1e-5,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        "mamba_hidden_act": "silu",
        "mlp_hidden_act": "relu2",
        "use_conv_bias": True,
        "use_bias": False,
    },
}
_model_dirs: dict[str, Path] = {}


# --------------------------------------------------------------------------------------
# Monkeypatches
# --------------------------------------------------------------------------------------


class _Patches:
    """Attribute and environment replacements, undone in reverse order."""

    _MISSING = object()

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def setattr(self, target: Any, name: str, value: Any) -> None:
        # Read the target's own namespace, not getattr: a classmethod must be put back
        # as the descriptor it was, and an attribute the target only inherits must be
        # deleted again rather than pinned onto it.
        old = vars(target).get(name, self._MISSING)
        setattr(target, name, value)
        if old is self._MISSING:
            self._undo.append(lambda: delattr(target, name))
        else:
            self._undo.append(lambda: setattr(target, name, old))

    def setenv(self, name: str, value: str) -> None:
        old = os.environ.get(name)
        os.environ[name] = value
        if old is None:
            self._undo.append(lambda: os.environ.pop(name, None))
        else:
            self._undo.append(lambda: os.environ.__setitem__(name, old))

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


@contextlib.contextmanager
def _single_process_worker_patches() -> Iterator[None]:
    """What a NIXL connector worker needs from a running engine, stood in for.

    Each patch replaces a name where ``base_worker`` looks it up, and is active only
    while the worker is built and registers its caches: the worker reads these once,
    in ``__init__``, and keeps the answers.
    """
    patches = _Patches()
    try:
        # No torch.distributed group exists in a test process. Each engine here is a
        # single rank, so its tensor-parallel rank is 0 of a world of 1. (The
        # prefill-context-parallel group is looked up only when its size is > 1.)
        patches.setattr(nixl_base_worker, "get_tensor_model_parallel_rank", lambda: 0)
        patches.setattr(nixl_base_worker, "get_tensor_model_parallel_world_size", lambda: 1)
        # The worker finds its attention backend by walking the model's attention
        # layers; no model is built here, so it is told the backend those layers would
        # use on this platform (the CPU attention kernel).
        patches.setattr(
            nixl_base_worker,
            "get_current_attn_backends",
            lambda vllm_config, layer_names=None: [CPUAttentionBackend],
        )
        # On CPU the worker pins the calling process to the last core of each NUMA node
        # (os.sched_setaffinity), meant for a dedicated engine process. Here that
        # process is the test runner, so no node is reported and nothing is pinned.
        patches.setattr(current_platform, "discover_numa_topology", lambda: [])
        yield
    finally:
        patches.undo()


@contextlib.contextmanager
def _block_size_patches() -> Iterator[None]:
    """Let the platform size blocks as it does after loading a model.

    ``update_block_size_for_backend`` asks the model's attention layers which backend
    they use; without a model it would find none and skip the sizing, so it is told
    the CPU attention backend, which is what those layers pick on this machine.
    """
    patches = _Patches()
    try:
        patches.setattr(
            type(current_platform),
            "_find_non_ssm_backends",
            classmethod(lambda cls, vllm_config: [CPUAttentionBackend]),
        )
        yield
    finally:
        patches.undo()


# --------------------------------------------------------------------------------------
# Configs and KV caches
# --------------------------------------------------------------------------------------


def _model_dir(kind: Kind) -> Path:
    """A directory holding only the model's config.json (vLLM reads shapes from it)."""
    if kind not in _model_dirs:
        directory = Path(tempfile.mkdtemp(prefix=f"hybridtrace-{kind}-model-"))
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        (directory / "config.json").write_text(json.dumps(_MODEL_CONFIGS[kind]))
        _model_dirs[kind] = directory
    return _model_dirs[kind]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _connector_names(connector_cls: type[KVConnectorBase_V1]) -> dict[str, Any]:
    # Stock NixlConnector is registered by name; a subclass is found by module path,
    # the way a deployment names an out-of-tree connector.
    if connector_cls is NixlConnector:
        return {"kv_connector": "NixlConnector"}
    return {
        "kv_connector": connector_cls.__name__,
        "kv_connector_module_path": connector_cls.__module__,
    }


def _build_vllm_config(
    kind: Kind,
    kv_role: str,
    engine_id: str,
    connector_cls: type[KVConnectorBase_V1],
    extra_config: dict[str, Any],
    num_blocks: int,
    dtype: str,
    block_size: int,
    max_model_len: int,
) -> VllmConfig:
    model_config = ModelConfig(
        model=str(_model_dir(kind)),
        skip_tokenizer_init=True,
        dtype=dtype,
        max_model_len=max_model_len,
    )
    cache_config = CacheConfig(block_size=block_size)
    kv_transfer_config = KVTransferConfig(
        kv_role=kv_role,
        engine_id=engine_id,
        kv_buffer_device="cpu",
        kv_connector_extra_config=dict(extra_config),
        **_connector_names(connector_cls),
    )
    vllm_config = VllmConfig(
        model_config=model_config,
        cache_config=cache_config,
        kv_transfer_config=kv_transfer_config,
    )
    if kind == "hybrid" and vllm_config.scheduler_config.disable_hybrid_kv_cache_manager:
        raise RuntimeError("the hybrid KV-cache manager is off; the hybrid pair needs it on")
    with _block_size_patches():
        current_platform.update_block_size_for_backend(vllm_config)
    # The engine sizes the pool from free memory; a fixed count keeps it small.
    vllm_config.cache_config.num_gpu_blocks_override = num_blocks
    return vllm_config


def _layer_specs(kind: Kind, vllm_config: VllmConfig) -> dict[str, KVCacheSpec]:
    """The KV-cache spec each layer of the model reports, keyed by its layer name.

    Built the way the layers build them (``Attention.get_kv_cache_spec``,
    ``MambaMixer2.get_kv_cache_spec``), from the model class's own state-shape and
    state-dtype functions, since no model is instantiated.
    """
    model_config = vllm_config.model_config
    cache_config = vllm_config.cache_config
    hf_config = model_config.hf_config

    def attention() -> FullAttentionSpec:
        return FullAttentionSpec(
            block_size=cache_config.block_size,
            num_kv_heads=model_config.get_num_kv_heads(vllm_config.parallel_config),
            head_size=model_config.get_head_size(),
            dtype=model_config.dtype,
        )

    if kind == "attention":
        return {f"model.layers.{i}.self_attn.attn": attention() for i in range(hf_config.num_hidden_layers)}

    model_cls, _ = model_config.registry.resolve_model_cls(model_config.architectures, model_config)
    specs: dict[str, KVCacheSpec] = {}
    for i, layer_type in enumerate(hf_config.hybrid_override_pattern):
        if layer_type == "M":
            assert cache_config.mamba_block_size is not None
            specs[f"model.layers.{i}.mixer"] = MambaSpec(
                shapes=tuple(model_cls.get_mamba_state_shape_from_config(vllm_config)),
                dtypes=tuple(model_cls.get_mamba_state_dtype_from_config(vllm_config)),
                block_size=cache_config.mamba_block_size,
                page_size_padded=cache_config.mamba_page_size_padded,
                mamba_cache_mode=cache_config.mamba_cache_mode,
                # As MambaMixer2 reports them: it can export the block-boundary state
                # from inside one forward pass.
                num_prefill_checkpoint_blocks=1,
                prefill_checkpoint_alignment=1,
            )
        elif layer_type == "*":
            specs[f"model.layers.{i}.mixer.attn"] = attention()
        else:
            raise ValueError(f"layer type {layer_type!r} has no KV cache in this harness")
    return specs


def _plan_kv_caches(
    kind: Kind, vllm_config: VllmConfig
) -> tuple[KVCacheConfig, dict[str, torch.Tensor], dict[str, KVCacheSpec]]:
    """Plan and allocate one engine's KV cache as its engine core and worker would."""
    register_all_kvcache_specs(vllm_config)
    specs = _layer_specs(kind, vllm_config)
    backends: list[Any] = [CPUAttentionBackend]
    if any(isinstance(spec, MambaSpec) for spec in specs.values()):
        from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionBackend

        backends.append(Mamba2AttentionBackend)
    supported = [layout.name for layout in get_supported_kv_cache_layouts(backends)]
    layout = resolve_kv_cache_layout(vllm_config, [supported], list(specs.values()))
    groups = get_global_kv_cache_groups(vllm_config, [specs])
    # Memory is not the limit here (num_gpu_blocks_override sets the block count).
    (kv_cache_config,) = get_kv_cache_configs(vllm_config, [specs], [1 << 40], groups)
    kv_cache_config.kv_cache_layout = vllm_config.cache_config.kv_cache_layout
    # Kernel block sizes equal the logical ones: every group's block size is already a
    # multiple of the CPU kernel's 32 tokens, so nothing is split.
    kernel_block_sizes = [group.kv_cache_spec.block_size for group in kv_cache_config.kv_cache_groups]
    kv_caches = allocate_kv_cache(kv_cache_config, torch.device("cpu"), layout, kernel_block_sizes)
    layer_specs = {
        name: group.kv_cache_spec for group in kv_cache_config.kv_cache_groups for name in group.layer_names
    }
    return kv_cache_config, kv_caches, layer_specs


def transferred_bytes_per_block(spec: KVCacheSpec) -> int:
    """Bytes one read moves for one block of one layer with this spec.

    An attention block crosses whole (K and V of every token slot). A Mamba block
    crosses only its state, conv plus SSM, not the padding that makes its page as
    large as an attention page.
    """
    if isinstance(spec, MambaSpec):
        return spec.state_content_size_bytes
    if isinstance(spec, AttentionSpec):
        return spec.page_size_bytes
    raise TypeError(f"no transfer size for {type(spec).__name__}")


# --------------------------------------------------------------------------------------
# One engine: scheduler-side connector, worker-side connector, block pool
# --------------------------------------------------------------------------------------


class _BlockPool:
    """Free block ids of one engine. Block 0 is held back as the null block, as vLLM's
    BlockPool does, so it never carries a request's data.

    ``descending`` hands out the highest ids first. The decode uses it so that its
    block ids differ from the prefill's: a read that confused local and remote ids
    would then show in the bytes.
    """

    def __init__(self, num_blocks: int, *, descending: bool = False) -> None:
        self.null_block = KVCacheBlock(0, is_null=True)
        self._descending = descending
        self._free = self._ordered(range(1, num_blocks))

    def _ordered(self, ids: Iterable[int]) -> list[int]:
        return sorted(ids, reverse=self._descending)

    def take(self, n: int) -> list[KVCacheBlock]:
        if n > len(self._free):
            raise RuntimeError(f"block pool exhausted: asked for {n}, {len(self._free)} free")
        taken, self._free = self._free[:n], self._free[n:]
        return [KVCacheBlock(block_id, ref_cnt=1) for block_id in taken]

    def give_back(self, blocks: KVCacheBlocks) -> None:
        for group in blocks.blocks:
            self._free.extend(block.block_id for block in group if not block.is_null)
        self._free = self._ordered(self._free)

    @property
    def num_free(self) -> int:
        return len(self._free)


@dataclass
class StepOutput:
    """What one engine step reported, as the model runner collects it."""

    finished_sending: set[str] = field(default_factory=set)
    finished_recving: set[str] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)
    invalid_block_ids: set[int] = field(default_factory=set)
    bytes_transferred: list[int] = field(default_factory=list)
    num_descriptors: list[int] = field(default_factory=list)


@dataclass
class Engine:
    """One side of the pair: its configs, caches and the two connector halves."""

    name: str
    engine_id: str
    vllm_config: VllmConfig
    kv_cache_config: KVCacheConfig
    kv_caches: dict[str, torch.Tensor]
    layer_specs: dict[str, KVCacheSpec]
    connector: KVConnectorBase_V1
    scheduler_connector: KVConnectorBase_V1
    poll: Literal["get_transfer_results", "get_finished"] = "get_transfer_results"
    pool: _BlockPool = field(init=False)
    requests: dict[str, tuple[Request, KVCacheBlocks]] = field(default_factory=dict)
    # Called with each step's metadata before the worker sees it (tests use it to
    # shorten a lease or inspect what the scheduler side asked for).
    metadata_hooks: list[Callable[[NixlConnectorMetadata], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.pool = _BlockPool(self.kv_cache_config.num_blocks, descending=self.name == "decode")

    @property
    def group_block_sizes(self) -> list[int]:
        return [group.kv_cache_spec.block_size for group in self.kv_cache_config.kv_cache_groups]

    def allocate(self, request: Request, num_tokens: int) -> KVCacheBlocks:
        """Blocks for ``num_tokens`` tokens in every group, laid out as the KV-cache
        manager hands them to the connector.

        Attention groups get one block per ``block_size`` tokens. A Mamba group's list
        is indexed by token position like an attention group's, but only its last
        entry holds state; the ones before are the null block (the manager nulls
        superseded states), and the connector keeps only the last.
        """
        groups: list[list[KVCacheBlock]] = []
        for group in self.kv_cache_config.kv_cache_groups:
            spec = group.kv_cache_spec
            n = -(-num_tokens // spec.block_size) if num_tokens else 0
            if isinstance(spec, MambaSpec):
                if spec.mamba_cache_mode == "align":
                    groups.append([self.pool.null_block] * max(n - 1, 0) + self.pool.take(min(n, 1)))
                else:
                    groups.append(self.pool.take(min(n, 1)))
            else:
                groups.append(self.pool.take(n))
        blocks = KVCacheBlocks(tuple(groups))
        self.requests[request.request_id] = (request, blocks)
        return blocks

    def free(self, request_id: str) -> None:
        entry = self.requests.pop(request_id, None)
        if entry is not None:
            self.pool.give_back(entry[1])

    def step(self, metadata: NixlConnectorMetadata | None = None) -> StepOutput:
        """One engine step as the model runner drives a connector.

        The scheduler side builds the step's metadata unless ``metadata`` is given (a
        hand-built one, to drive the worker alone); either way the worker gets it bound
        for ``start_load_kv`` and the completions go back to the scheduler side.
        """
        if metadata is None:
            built = self.scheduler_connector.build_connector_meta(SchedulerOutput.make_empty())
            assert isinstance(built, NixlConnectorMetadata)
            metadata = built
        for hook in self.metadata_hooks:
            hook(metadata)
        connector = self.connector
        connector.bind_connector_metadata(metadata)
        # The pull connector ignores the forward context; no forward pass runs here.
        connector.start_load_kv(cast(Any, None))
        connector.wait_for_save()
        out = StepOutput()
        if self.poll == "get_finished":
            sending, recving = connector.get_finished(set())
            out.finished_sending = set(sending or ())
            out.finished_recving = set(recving or ())
        else:
            results = connector.get_transfer_results(set())
            out.finished_sending = set(results.finished_sending)
            out.finished_recving = set(results.finished_recving)
            out.failed_recving = set(results.failed_recving)
        out.invalid_block_ids = connector.get_block_ids_with_load_errors()
        stats = connector.get_kv_connector_stats()
        if stats is not None:
            out.bytes_transferred = list(stats.data.get("bytes_transferred", []))
            out.num_descriptors = list(stats.data.get("num_descriptors", []))
        connector.clear_connector_metadata()
        self.scheduler_connector.update_connector_output(
            KVConnectorOutput(
                finished_sending=out.finished_sending,
                finished_recving=out.finished_recving,
                failed_recving=out.failed_recving,
                invalid_block_ids=out.invalid_block_ids,
                kv_connector_stats=stats,
            )
        )
        # A prefill request's blocks go back to the pool once its send finished (or
        # its lease ran out); the engine frees them at this point too.
        for request_id in out.finished_sending:
            self.free(request_id)
        return out

    def block_ids(self, blocks: KVCacheBlocks) -> BlockIds:
        return tuple([block.block_id for block in group] for group in blocks.blocks)


def _make_engine(
    name: str,
    kind: Kind,
    kv_role: str,
    engine_id: str,
    connector_cls: type[KVConnectorBase_V1],
    extra_config: dict[str, Any],
    num_blocks: int,
    dtype: str,
    block_size: int,
    max_model_len: int,
    poll: Literal["get_transfer_results", "get_finished"],
    side_channel_port: int,
) -> Engine:
    vllm_config = _build_vllm_config(
        kind,
        kv_role,
        engine_id,
        connector_cls,
        extra_config,
        num_blocks,
        dtype,
        block_size,
        max_model_len,
    )
    kv_cache_config, kv_caches, layer_specs = _plan_kv_caches(kind, vllm_config)
    with _single_process_worker_patches():
        worker = connector_cls(vllm_config, KVConnectorRole.WORKER, kv_cache_config)
        worker.register_kv_caches(kv_caches)
    # The scheduler side reads its side-channel address from the environment when it
    # is built; each prefill gets its own free port so pairs never collide.
    patches = _Patches()
    try:
        patches.setenv("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
        patches.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", str(side_channel_port))
        scheduler = connector_cls(vllm_config, KVConnectorRole.SCHEDULER, kv_cache_config)
    finally:
        patches.undo()
    return Engine(
        name=name,
        engine_id=engine_id,
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        kv_caches=kv_caches,
        layer_specs=layer_specs,
        connector=worker,
        scheduler_connector=scheduler,
        poll=poll,
    )


# --------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------


@dataclass
class TransferResult:
    """One request's trip from prefill to decode.

    ``prefill_blocks`` / ``decode_blocks`` are the block ids the connectors exchanged
    (after their own clipping: one state block per Mamba group), per group in
    ``kv_cache_groups`` order. ``nixl_bytes`` / ``nixl_descriptors`` / ``num_reads``
    are what NIXL's telemetry said the decode's reads moved (through the connector's
    ``get_kv_connector_stats``); compare the bytes with :func:`expected_read_bytes`.
    ``failed`` holds the decode request id when the decode reported the read failed
    (``failed_recving``; under ``poll="get_finished"`` only load-error blocks show it).
    ``seconds`` and ``steps`` run from the decode being asked to read until both sides
    reported (the handshake, done on the first read, included).
    """

    request_id: str
    decode_request_id: str
    num_tokens: int
    prefill_blocks: BlockIds
    decode_blocks: BlockIds
    kv_transfer_params: dict[str, Any]
    received: bool = False
    sent: bool = False
    failed: set[str] = field(default_factory=set)
    invalid_block_ids: set[int] = field(default_factory=set)
    finished_sending: set[str] = field(default_factory=set)
    finished_recving: set[str] = field(default_factory=set)
    nixl_bytes: int = 0
    nixl_descriptors: int = 0
    num_reads: int = 0
    seconds: float = 0.0
    steps: int = 0

    @property
    def ok(self) -> bool:
        return self.received and self.sent and not self.failed


@dataclass
class LeaseResult:
    """A prefill request whose lease ran out before any decode read it."""

    request_id: str
    prefill_blocks: BlockIds
    lease_s: float
    released: bool = False
    seconds: float = 0.0
    log_messages: list[str] = field(default_factory=list)


class _LogCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def _capture_worker_log() -> Iterator[_LogCapture]:
    handler = _LogCapture()
    logger = logging.getLogger(_BASE_WORKER_LOGGER)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


# --------------------------------------------------------------------------------------
# The pair
# --------------------------------------------------------------------------------------


@dataclass
class Pair:
    """A prefill engine and a decode engine, handshaken lazily on the first read."""

    kind: Kind
    prefill_engine: Engine
    decode_engine: Engine
    timeout_s: float = DEFAULT_TIMEOUT_S
    _written: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict, repr=False)
    _closed: bool = False

    # Names the tests use most, kept flat.
    @property
    def prefill(self) -> KVConnectorBase_V1:
        """The prefill's WORKER-role connector."""
        return self.prefill_engine.connector

    @property
    def decode(self) -> KVConnectorBase_V1:
        """The decode's WORKER-role connector."""
        return self.decode_engine.connector

    @property
    def prefill_scheduler(self) -> KVConnectorBase_V1:
        return self.prefill_engine.scheduler_connector

    @property
    def decode_scheduler(self) -> KVConnectorBase_V1:
        return self.decode_engine.scheduler_connector

    @property
    def prefill_kv_caches(self) -> dict[str, torch.Tensor]:
        return self.prefill_engine.kv_caches

    @property
    def decode_kv_caches(self) -> dict[str, torch.Tensor]:
        return self.decode_engine.kv_caches

    @property
    def prefill_kv_cache_config(self) -> KVCacheConfig:
        return self.prefill_engine.kv_cache_config

    @property
    def decode_kv_cache_config(self) -> KVCacheConfig:
        return self.decode_engine.kv_cache_config

    @property
    def prefill_config(self) -> VllmConfig:
        return self.prefill_engine.vllm_config

    @property
    def decode_config(self) -> VllmConfig:
        return self.decode_engine.vllm_config

    @property
    def block_size(self) -> int:
        """Tokens per block of the attention groups (what the engine calls block size)."""
        return int(self.prefill_config.cache_config.block_size)

    @property
    def group_kinds(self) -> list[str]:
        """Whether each KV-cache group is "mamba" or "attention", in group order."""
        return [
            "mamba" if isinstance(group.kv_cache_spec, MambaSpec) else "attention"
            for group in self.prefill_kv_cache_config.kv_cache_groups
        ]

    # ---- bytes ---------------------------------------------------------------------

    def fill_prefill(self, request_blocks: BlockIds, seed: int = 0) -> None:
        """Write random bytes into the prefill's blocks of a request, in every group.

        Stands in for the prefill's forward pass. Attention blocks get random pages;
        Mamba blocks get random bytes over the whole padded page, so a read that
        wrongly moved the padding would show on the decode side.
        """
        generator = torch.Generator().manual_seed(seed)
        engine = self.prefill_engine
        for group_index, group in enumerate(engine.kv_cache_config.kv_cache_groups):
            for layer in group.layer_names:
                cache = engine.kv_caches[layer]
                page = _page_bytes_len(cache)
                for block_id in request_blocks[group_index]:
                    data = torch.randint(0, 256, (page,), dtype=torch.uint8, generator=generator)
                    _block_bytes(cache, block_id, page).copy_(data)
                    self._written[(layer, block_id)] = data

    def fill_decode_sentinel(self, request_blocks: BlockIds) -> None:
        """Set the decode's blocks of a request to a known byte before they are read."""
        engine = self.decode_engine
        for group_index, group in enumerate(engine.kv_cache_config.kv_cache_groups):
            for layer in group.layer_names:
                cache = engine.kv_caches[layer]
                for block_id in request_blocks[group_index]:
                    _block_bytes(cache, block_id, _page_bytes_len(cache)).fill_(DECODE_SENTINEL_BYTE)

    def decode_mismatches(
        self, result_or_prefill: TransferResult | BlockIds, decode_blocks: BlockIds | None = None
    ) -> list[str]:
        """Every way the decode's blocks differ from what :meth:`fill_prefill` wrote.

        Blocks pair up per group, in order. The bytes that cross (a whole attention
        page; a Mamba layer's unpadded conv+SSM state) must equal the prefill's; a
        Mamba page's padding must still hold the decode's sentinel. An empty list means
        the transfer was exact.
        """
        prefill_blocks, decode_blocks = _blocks_of(result_or_prefill, decode_blocks)
        problems: list[str] = []
        engine = self.decode_engine
        for group_index, group in enumerate(engine.kv_cache_config.kv_cache_groups):
            p_ids, d_ids = prefill_blocks[group_index], decode_blocks[group_index]
            if len(p_ids) != len(d_ids):
                problems.append(f"group {group_index}: {len(p_ids)} prefill blocks, {len(d_ids)} decode")
                continue
            for layer in group.layer_names:
                cache = engine.kv_caches[layer]
                spec = engine.layer_specs[layer]
                crossed = transferred_bytes_per_block(spec)
                page = _page_bytes_len(cache)
                for p_id, d_id in zip(p_ids, d_ids, strict=True):
                    want = self._written.get((layer, p_id))
                    if want is None:
                        problems.append(f"{layer}: prefill block {p_id} was never filled")
                        continue
                    got = _block_bytes(cache, d_id, page)
                    if not torch.equal(got[:crossed], want[:crossed]):
                        bad = int((got[:crossed] != want[:crossed]).sum())
                        problems.append(
                            f"{layer}: decode block {d_id} differs from prefill block {p_id} "
                            f"in {bad} of {crossed} bytes"
                        )
                    if crossed < page and not bool((got[crossed:] == DECODE_SENTINEL_BYTE).all()):
                        problems.append(
                            f"{layer}: padding of decode block {d_id} was overwritten "
                            f"(bytes {crossed}..{page} crossed)"
                        )
        return problems

    def decode_matches(
        self, result_or_prefill: TransferResult | BlockIds, decode_blocks: BlockIds | None = None
    ) -> bool:
        """True when the decode's blocks hold, byte for byte, what crossed from the
        prefill's (see :meth:`decode_mismatches` for the reasons when not)."""
        return not self.decode_mismatches(result_or_prefill, decode_blocks)

    # ---- requests ------------------------------------------------------------------

    def transfer(
        self,
        request_id: str,
        num_tokens: int,
        *,
        decode_request_id: str | None = None,
        seed: int = 0,
        tamper: Callable[[dict[str, Any]], None] | None = None,
        wait_for_send: bool = True,
        timeout_s: float | None = None,
    ) -> TransferResult:
        """Run one request end to end and wait until both sides report it.

        The prefill's scheduler side admits the request (``do_remote_decode``), its
        blocks are filled (the "forward pass"), the request finishes and
        ``request_finished_all_groups`` hands back the ``kv_transfer_params`` with the
        lease; the decode's scheduler side admits a request carrying them
        (``do_remote_prefill``), allocates and asks its worker to read. Then both
        engines step (``build_connector_meta`` → ``bind_connector_metadata`` →
        ``start_load_kv`` → ``get_transfer_results`` → ``clear_connector_metadata``)
        until the decode reports the request received (or failed) and, unless
        ``wait_for_send`` is false, the prefill reports it sent.

        ``tamper`` may rewrite the ``kv_transfer_params`` between the two engines, as a
        faulty router would. Raises ``TimeoutError`` naming what was still missing.
        """
        decode_request_id = decode_request_id or f"{request_id}-decode"
        deadline_s = self.timeout_s if timeout_s is None else timeout_s
        p_engine, d_engine = self.prefill_engine, self.decode_engine

        prefill_blocks, params = self._prefill(request_id, num_tokens, seed)
        if tamper is not None:
            tamper(params)

        # Decode: a new request that names the prefill's blocks.
        d_request = _make_request(decode_request_id, num_tokens, {**params, "do_remote_prefill": True})
        d_sched = d_engine.scheduler_connector
        d_sched.on_new_request(d_request)
        num_external, load_async = d_sched.get_num_new_matched_tokens(d_request, 0)
        if not num_external or not load_async:
            raise AssertionError(
                f"decode scheduler would not load {decode_request_id}: "
                f"get_num_new_matched_tokens -> ({num_external}, {load_async})"
            )
        d_blocks = d_engine.allocate(d_request, num_external)
        d_sched.update_state_after_alloc(d_request, d_blocks, num_external)
        decode_blocks = _clipped(d_engine, d_engine.block_ids(d_blocks))
        self.fill_decode_sentinel(decode_blocks)

        result = TransferResult(
            request_id=request_id,
            decode_request_id=decode_request_id,
            num_tokens=num_tokens,
            prefill_blocks=prefill_blocks,
            decode_blocks=decode_blocks,
            kv_transfer_params=params,
        )
        start = time.perf_counter()
        while True:
            d_out = d_engine.step()
            p_out = p_engine.step()
            result.steps += 1
            result.finished_recving |= d_out.finished_recving
            result.finished_sending |= p_out.finished_sending
            result.failed |= d_out.failed_recving & {decode_request_id}
            result.invalid_block_ids |= d_out.invalid_block_ids
            result.nixl_bytes += sum(d_out.bytes_transferred)
            result.nixl_descriptors += sum(d_out.num_descriptors)
            result.num_reads += len(d_out.bytes_transferred)
            if decode_request_id in d_out.finished_recving:
                result.received = decode_request_id not in result.failed
                # A failed read under get_finished shows only as load-error blocks.
                if result.invalid_block_ids & set(itertools.chain.from_iterable(decode_blocks)):
                    result.failed.add(decode_request_id)
                    result.received = False
            result.sent = request_id in result.finished_sending
            recv_done = decode_request_id in result.finished_recving
            if recv_done and (result.sent or not wait_for_send or result.failed):
                break
            if time.perf_counter() - start > deadline_s:
                missing = []
                if not recv_done:
                    missing.append(f"decode never reported {decode_request_id} received")
                if wait_for_send and not result.sent:
                    missing.append(f"prefill never reported {request_id} sent")
                raise TimeoutError(
                    f"transfer of {request_id} not finished after {deadline_s:.1f}s "
                    f"({result.steps} steps): {'; '.join(missing)}"
                )
            time.sleep(0.001)
        result.seconds = time.perf_counter() - start

        # The decode request runs on and finishes; the decode then frees its blocks.
        d_request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        d_request.num_computed_tokens = num_external
        _request_finished(d_sched, d_request, d_engine.block_ids(d_blocks))
        d_engine.free(decode_request_id)
        return result

    def transfer_failing(
        self,
        request_id: str,
        num_tokens: int,
        *,
        how: Literal["remote_blocks_out_of_range"] = "remote_blocks_out_of_range",
        **kwargs: Any,
    ) -> TransferResult:
        """A transfer whose read must fail; the decode has to report it failed.

        ``remote_blocks_out_of_range``: the router hands the decode remote block ids
        past the end of the prefill's pool, so NIXL rejects the read when it is
        prepared (``make_prepped_xfer``). The prefill is never notified, so it keeps
        the blocks until their lease runs out; this does not wait for that.
        """
        if how != "remote_blocks_out_of_range":
            raise ValueError(f"unknown failure {how!r}")
        num_remote_blocks = self.prefill_kv_cache_config.num_blocks

        def out_of_range(params: dict[str, Any]) -> None:
            params["remote_block_ids"] = tuple(
                [block_id + 4 * num_remote_blocks for block_id in group]
                for group in params["remote_block_ids"]
            )

        return self.transfer(request_id, num_tokens, tamper=out_of_range, wait_for_send=False, **kwargs)

    def expire_lease(
        self,
        request_id: str,
        num_tokens: int,
        *,
        lease_s: float = 0.3,
        seed: int = 0,
        timeout_s: float | None = None,
    ) -> LeaseResult:
        """A prefill request told to send with a short lease, which no decode reads.

        The prefill's worker must release the blocks itself once the lease runs out
        (``get_transfer_results`` reports the request sent and vLLM logs "Releasing
        expired KV blocks for request …"). The lease is shortened in the metadata the
        scheduler side built (``reqs_to_send`` deadline, on the scheduler's clock), so
        the pair's configured ``kv_lease_duration`` stays as it was.
        """
        p_engine = self.prefill_engine

        def shorten(metadata: NixlConnectorMetadata) -> None:
            if request_id in metadata.reqs_to_send:
                metadata.reqs_to_send[request_id] = metadata.scheduler_clock + lease_s

        p_engine.metadata_hooks.append(shorten)
        deadline_s = self.timeout_s if timeout_s is None else timeout_s
        try:
            with _capture_worker_log() as log:
                prefill_blocks, _ = self._prefill(request_id, num_tokens, seed)
                result = LeaseResult(request_id=request_id, prefill_blocks=prefill_blocks, lease_s=lease_s)
                start = time.perf_counter()
                while not result.released:
                    out = p_engine.step()
                    result.released = request_id in out.finished_sending
                    if not result.released and time.perf_counter() - start > deadline_s + lease_s:
                        raise TimeoutError(
                            f"prefill kept {request_id} past its {lease_s}s lease for {deadline_s:.1f}s"
                        )
                    time.sleep(0.005)
                result.seconds = time.perf_counter() - start
                result.log_messages = [m for m in log.messages if request_id in m]
        finally:
            p_engine.metadata_hooks.remove(shorten)
        return result

    def _prefill(self, request_id: str, num_tokens: int, seed: int) -> tuple[BlockIds, dict[str, Any]]:
        """Admit, "compute" and finish a prefill request; return its blocks and the
        ``kv_transfer_params`` its scheduler side hands to the router."""
        p_engine = self.prefill_engine
        p_sched = p_engine.scheduler_connector
        request = _make_request(
            request_id, num_tokens, {"do_remote_decode": True, "do_remote_prefill": False}
        )
        # For a hybrid model this drops the last prompt token: the decode recomputes
        # it to rebuild the Mamba state.
        p_sched.on_new_request(request)
        num_external, _ = p_sched.get_num_new_matched_tokens(request, 0)
        assert num_external == 0, "a prefill request should load nothing"
        blocks = p_engine.allocate(request, request.num_prompt_tokens)
        p_sched.update_state_after_alloc(request, blocks, 0)
        # The step that runs the prefill's forward pass: the scheduler side tells the
        # worker the request is in the batch.
        p_engine.step()
        all_block_ids = p_engine.block_ids(blocks)
        self.fill_prefill(all_block_ids, seed=seed)
        request.num_computed_tokens = request.num_prompt_tokens
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        delay_free, params = _request_finished(p_sched, request, all_block_ids)
        assert delay_free and params is not None, "the prefill did not hold its blocks for the decode"
        # The next step carries the lease to the worker (reqs_to_send).
        p_engine.step()
        return _clipped(p_engine, all_block_ids), params

    # ---- lifetime ------------------------------------------------------------------

    def close(self) -> None:
        """Shut both engines' connectors down (NIXL agents, side channel, threads)."""
        if self._closed:
            return
        self._closed = True
        for engine in (self.decode_engine, self.prefill_engine):
            for connector in (engine.connector, engine.scheduler_connector):
                with contextlib.suppress(Exception):
                    connector.shutdown()

    def __enter__(self) -> Pair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_pair(
    kind: Kind,
    connector_cls: type[KVConnectorBase_V1] | None = None,
    extra_config: dict[str, Any] | None = None,
    num_blocks: int = 32,
    *,
    dtype: str = "bfloat16",
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    poll: Literal["get_transfer_results", "get_finished"] = "get_transfer_results",
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Pair:
    """Build a prefill (``kv_producer``, "prefill-0") and a decode (``kv_consumer``,
    "decode-0") engine for ``kind`` with ``connector_cls`` (vLLM's ``NixlConnector``
    unless given; a subclass taking the same constructor arguments works the same).

    ``extra_config`` becomes ``kv_connector_extra_config`` on both sides (e.g.
    ``{"kv_lease_duration": 5}``). ``poll`` picks how steps collect completions:
    ``get_transfer_results`` as vLLM's model runner does (it reports failed reads by
    request), or the older ``get_finished`` (failures then show only as load-error
    blocks, which the hybrid model does not report).
    """
    if current_platform.device_type != "cpu":
        raise RuntimeError(
            f"vLLM chose the {current_platform.device_type!r} platform; import this harness "
            "before vLLM or set VLLM_TARGET_DEVICE=cpu"
        )
    cls = connector_cls or NixlConnector
    extra = dict(extra_config or {})
    common: dict[str, Any] = {
        "kind": kind,
        "connector_cls": cls,
        "extra_config": extra,
        "num_blocks": num_blocks,
        "dtype": dtype,
        "block_size": block_size,
        "max_model_len": max_model_len,
        "poll": poll,
    }
    prefill = _make_engine(
        "prefill",
        kv_role="kv_producer",
        engine_id=PREFILL_ENGINE_ID,
        side_channel_port=_free_port(),
        **common,
    )
    try:
        decode = _make_engine(
            "decode",
            kv_role="kv_consumer",
            engine_id=DECODE_ENGINE_ID,
            side_channel_port=_free_port(),
            **common,
        )
    except BaseException:
        prefill.connector.shutdown()
        prefill.scheduler_connector.shutdown()
        raise
    # As the engine core does after the workers registered their caches: the prefill's
    # scheduler side gets the worker's handshake metadata and serves it to decoders.
    handshake = prefill.connector.get_handshake_metadata()
    assert handshake is not None, "the prefill worker published no handshake metadata"
    prefill.scheduler_connector.set_xfer_handshake_metadata_pp_aware({(0, 0): handshake})
    return Pair(kind=kind, prefill_engine=prefill, decode_engine=decode, timeout_s=timeout_s)


def expected_read_bytes(pair: Pair, blocks_per_group: BlockIds) -> int:
    """Bytes the decode's reads must move for these blocks, from the tensors' specs.

    Per group: blocks × layers × bytes of one block of one layer, where a Mamba block
    counts only its unpadded conv+SSM state. ``blocks_per_group`` is in
    ``kv_cache_groups`` order (e.g. ``TransferResult.decode_blocks``). NIXL is not
    consulted, so this is an independent check of what it reports.
    """
    engine = pair.decode_engine
    groups = engine.kv_cache_config.kv_cache_groups
    if len(blocks_per_group) != len(groups):
        raise ValueError(f"{len(blocks_per_group)} block lists for {len(groups)} KV-cache groups")
    total = 0
    for group, blocks in zip(groups, blocks_per_group, strict=True):
        total += len(blocks) * sum(
            transferred_bytes_per_block(engine.layer_specs[layer]) for layer in group.layer_names
        )
    return total


# --------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------


def _make_request(request_id: str, num_tokens: int, kv_transfer_params: dict[str, Any]) -> Request:
    return Request(
        request_id=request_id,
        prompt_token_ids=[(7 * i + 3) % 256 for i in range(num_tokens)],
        sampling_params=SamplingParams(max_tokens=8, extra_args={"kv_transfer_params": kv_transfer_params}),
        pooling_params=None,
    )


def _request_finished(
    scheduler_connector: KVConnectorBase_V1, request: Request, block_ids: BlockIds
) -> tuple[bool, dict[str, Any] | None]:
    # The engine's scheduler hands hybrid-capable connectors every group's blocks.
    if isinstance(scheduler_connector, SupportsHMA):
        return scheduler_connector.request_finished_all_groups(request, block_ids)
    return scheduler_connector.request_finished(request, block_ids[0])


def _clipped(engine: Engine, block_ids: BlockIds) -> BlockIds:
    """The block ids the connector exchanges for a request: null blocks dropped and each
    Mamba group cut to its one state block, as the scheduler side clips them. (No block
    is prefix-cached here, so none is left out as a local hit.)"""
    clipped: list[list[int]] = []
    for group, ids in zip(engine.kv_cache_config.kv_cache_groups, block_ids, strict=True):
        real = [block_id for block_id in ids if block_id != engine.pool.null_block.block_id]
        clipped.append(real[-1:] if isinstance(group.kv_cache_spec, MambaSpec) else real)
    return tuple(clipped)


def _blocks_of(
    result_or_prefill: TransferResult | BlockIds, decode_blocks: BlockIds | None
) -> tuple[BlockIds, BlockIds]:
    if isinstance(result_or_prefill, TransferResult):
        return result_or_prefill.prefill_blocks, result_or_prefill.decode_blocks
    if decode_blocks is None:
        raise TypeError("pass a TransferResult, or prefill and decode block ids")
    return result_or_prefill, decode_blocks


def _page_bytes_len(cache: torch.Tensor) -> int:
    """Bytes from one block's start to the next's in this layer's view (the page,
    padding included)."""
    return cache.stride(0) * cache.element_size()


def _block_bytes(cache: torch.Tensor, block_id: int, nbytes: int) -> torch.Tensor:
    """A writable uint8 view of ``nbytes`` from the start of one block of a layer."""
    if not 0 <= block_id < cache.shape[0]:
        raise IndexError(f"block {block_id} outside 0..{cache.shape[0] - 1}")
    start = (cache.storage_offset() + block_id * cache.stride(0)) * cache.element_size()
    flat = torch.empty(0, dtype=torch.uint8)
    flat.set_(cache.untyped_storage(), start, (nbytes,), (1,))
    return flat


__all__ = [
    "DECODE_ENGINE_ID",
    "PREFILL_ENGINE_ID",
    "BlockIds",
    "Engine",
    "LeaseResult",
    "Pair",
    "StepOutput",
    "TransferResult",
    "expected_read_bytes",
    "make_pair",
    "transferred_bytes_per_block",
]
