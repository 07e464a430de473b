"""vLLM's stock NIXL connector, traced: per-request, per-rank records in trace v1.

Turn it on by naming this module and keeping the class name::

    --kv-transfer-config '{"kv_connector": "NixlConnector",
                           "kv_connector_module_path": "hybridtrace.connector.vllm",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"hybridtrace_dir": "/var/log/hybridtrace"}}'

``hybridtrace_dir`` (else ``$HYBRIDTRACE_TRACE_DIR``) names the folder; with neither the
class is the stock connector and writes nothing. What it adds to the stock one:

- worker side: the NIXL agent is wrapped in a tap (``tap.py``) that notes every READ
  (descriptors, notification, state, NIXL's telemetry); a wrapper around the read's posting
  tells the tap which request, remote engine and remote rank it is for. An ``engine``
  record is written per process when the KV caches are registered, a ``transfer`` record
  per read, and on the prefill side a ``release`` record per lease that expired.
- scheduler side: a ``request`` record per decode-side request when its KV is done,
  from what ``get_num_new_matched_tokens`` and ``update_state_after_alloc`` saw.

Tested against vLLM 0.33 (see docs/tracing-vllm.md). The internals read here are named in
``HOOKED``; when one is missing the connector says so once and traces what the NIXL calls
alone show.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import re
import time
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlConnector as _StockConnector

from hybridtrace.connector import records
from hybridtrace.connector.tap import AgentTap, Read, read_facts
from hybridtrace.connector.writer import TraceWriter, say_once, trace_dir

# The worker and scheduler internals the hooks read or wrap; a test fails when one goes.
HOOKED = {
    "worker": ("nixl_wrapper", "_read_blocks", "_reap_expired_send_leases", "_get_new_notifs",
               "tp_rank", "world_size", "engine_id", "use_host_buffer", "kv_buffer_device",
               "kv_cache_layout", "transfer_topo", "_remote_agents", "dst_region_num_blocks",
               "num_blocks", "_physical_blocks_per_logical_kv_block", "src_xfer_handles_by_block_size",
               "block_size", "_reqs_to_send"),
    "scheduler": ("_reqs_need_recv",),
}

_ROLE = {"kv_producer": "prefill", "kv_consumer": "decode"}
# vLLM adds "-" and 8 random characters to the id the API was given (input_processor.py)
_INTERNAL_SUFFIX = re.compile(r"-[0-9A-Za-z]{8}$")


def external_request_id(request_id: str) -> str | None:
    """The id the OpenAI-compatible API returned for vLLM's internal ``request_id``."""
    return _INTERNAL_SUFFIX.sub("", request_id) if _INTERNAL_SUFFIX.search(request_id) else None


def _dtype_name(dtype: Any) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")


class NixlConnector(_StockConnector):
    """The stock ``NixlConnector``, writing hybridtrace's trace when a folder is set."""

    def __init__(self, vllm_config: Any, role: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(vllm_config, role, *args, **kwargs)
        self._trace_worker: _WorkerTrace | None = None
        self._trace_scheduler: _SchedulerTrace | None = None
        try:
            transfer = vllm_config.kv_transfer_config
            directory = trace_dir(transfer.kv_connector_extra_config)
            if directory is None:
                return
            if self.connector_worker is not None:
                self._trace_worker = _WorkerTrace(self, vllm_config, directory)
            if self.connector_scheduler is not None:
                self._trace_scheduler = _SchedulerTrace(self, vllm_config, directory)
        except Exception as error:
            say_once("setup", "tracing is off: cannot set it up (%r)", error)
            self._trace_worker = self._trace_scheduler = None

    # -- worker side ------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: Any) -> None:
        super().register_kv_caches(kv_caches)
        if self._trace_worker is not None:
            self._trace_worker.guard("register", self._trace_worker.registered)

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            for trace in (self._trace_worker, self._trace_scheduler):
                if trace is not None:
                    trace.guard("shutdown", trace.writer.close)

    # -- scheduler side ---------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        trace = self._trace_scheduler
        asked = trace.guard("match", trace.asked, request, num_computed_tokens) if trace else None
        result = super().get_num_new_matched_tokens(request, num_computed_tokens)
        if asked is not None:
            trace.guard("match", trace.matched, request, asked, result)
        return result

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> Any:
        result = super().update_state_after_alloc(request, blocks, num_external_tokens)
        if self._trace_scheduler is not None:
            self._trace_scheduler.guard("alloc", self._trace_scheduler.allocated, request,
                                        num_external_tokens)
        return result

    def update_connector_output(self, connector_output: Any) -> None:
        super().update_connector_output(connector_output)
        if self._trace_scheduler is not None:
            self._trace_scheduler.guard("output", self._trace_scheduler.done, connector_output)

    def request_finished(self, request: Any, block_ids: Any) -> Any:
        if self._trace_scheduler is not None:
            self._trace_scheduler.guard("finished", self._trace_scheduler.forget, request)
        return super().request_finished(request, block_ids)

    def request_finished_all_groups(self, request: Any, block_ids: Any) -> Any:
        if self._trace_scheduler is not None:
            self._trace_scheduler.guard("finished", self._trace_scheduler.forget, request)
        return super().request_finished_all_groups(request, block_ids)


class _Trace:
    writer: TraceWriter

    def guard(self, what: str, call: Any, *args: Any) -> Any:
        """``call(*args)``; an error is logged once per hook and the engine goes on."""
        try:
            return call(*args)
        except Exception as error:
            say_once(f"hook:{what}", "the %s hook failed (%r); the engine goes on, untraced there",
                     what, error)
            return None


def _role(connector: Any) -> str | None:
    extra = connector.kv_transfer_config.kv_connector_extra_config or {}
    role = extra.get("hybridtrace_role") or _ROLE.get(connector.kv_transfer_config.kv_role)
    return role if role in ("prefill", "decode") else None


def _part_bytes(connector: Any) -> int:
    extra = connector.kv_transfer_config.kv_connector_extra_config or {}
    try:
        return int(extra.get("hybridtrace_part_bytes", 0)) or 64 << 20
    except (TypeError, ValueError):
        return 64 << 20


class _WorkerTrace(_Trace):
    """One worker process: the engine record, a transfer record per read, releases."""

    def __init__(self, connector: Any, vllm_config: Any, directory: str) -> None:
        worker = connector.connector_worker
        self.worker = worker
        self.vllm_config = vllm_config
        self.engine_id = str(connector.engine_id)
        self.role = _role(connector)  # None under kv_both: learned from what the process does
        self.announced: set[str] = set()
        self.rank = int(getattr(worker, "tp_rank", 0))
        self.tp_size = int(getattr(worker, "world_size", 1))
        missing = [name for name in HOOKED["worker"] if not hasattr(worker, name)]
        if missing:
            say_once("worker-internals", "this vLLM's NIXL worker lacks %s; reads are traced from "
                     "the NIXL calls alone (no request ids where those come from them)", ", ".join(missing))
        self.agent_name = getattr(worker.nixl_wrapper, "name", None)
        self.writer = TraceWriter(directory, engine_id=self.engine_id, role=self.role or "both",
                                  rank=self.rank, part_bytes=_part_bytes(connector))
        self.remote_tp: dict[str, int] = {}
        self.layout: tuple | None = None
        self.groups: list[tuple[int, str, int]] = []
        self.engine_facts: dict | None = None
        self.tap = AgentTap(worker.nixl_wrapper, self._read_done)
        worker.nixl_wrapper = self.tap
        if hasattr(worker, "_read_blocks"):
            worker._read_blocks = self._wrap_read(worker._read_blocks)
        if hasattr(worker, "_reap_expired_send_leases") and hasattr(worker, "_reqs_to_send"):
            worker._reap_expired_send_leases = self._wrap_reap(worker._reap_expired_send_leases)
        if hasattr(worker, "_get_new_notifs") and self.role is None:
            worker._get_new_notifs = self._wrap_notifs(worker._get_new_notifs)

    # -- start-up ---------------------------------------------------------------------------

    def registered(self) -> None:
        """After ``register_kv_caches``: the groups, the descriptor layout, the engine record."""
        worker = self.worker
        config = worker.kv_cache_config
        transfer_ids = list(getattr(config, "transfer_group_ids", range(len(config.kv_cache_groups))))
        per_logical = int(getattr(worker, "_physical_blocks_per_logical_kv_block", 1) or 1)
        groups, kinds = _groups(config)
        self.groups = [(gid, kinds[gid], 1 if kinds[gid] == "mamba" else per_logical) for gid in transfer_ids]
        self.transfer_ids = transfer_ids
        try:
            regions = list(worker.dst_region_num_blocks[worker.engine_id])
            handle = worker.src_xfer_handles_by_block_size[worker.block_size]
            self.layout = (handle, regions, int(worker.num_blocks) // per_logical)
        except Exception as error:
            say_once("layout", "cannot read the descriptor layout (%r); reads are traced without "
                     "a per-group split", error)
        self.engine_facts = _engine_facts(self.vllm_config, worker, groups, self.agent_name)
        if self.role is not None:
            self.announce(self.role)

    def announce(self, role: str) -> None:
        if role in self.announced or self.engine_facts is None:
            return
        self.announced.add(role)
        record = records.engine_record(ts=time.time(), engine_id=self.engine_id, role=role,
                                       tp_size=self.tp_size, rank=self.rank, **self.engine_facts)
        self.writer.header(record)

    # -- the hot path: note and enqueue only ------------------------------------------------

    def _wrap_read(self, read_blocks: Any) -> Any:
        tap = self.tap
        remote_tp = self.remote_tp
        worker = self.worker

        def _read_blocks(*args: Any, **kwargs: Any) -> Any:
            try:
                spec = kwargs.get("read_spec")
                engine = kwargs.get("dst_engine_id")
                if engine not in remote_tp:
                    remote_tp[engine] = worker.transfer_topo.get_engine_info(engine).remote_tp_size
                tap.context = (kwargs.get("request_id"), engine, kwargs.get("remote_request_id"),
                               getattr(spec, "remote_rank", None), getattr(spec, "local_block_ids", None))
            except Exception as error:
                tap.context = None
                say_once("read-context", "cannot see which request a read is for (%r)", error)
            try:
                return read_blocks(*args, **kwargs)
            finally:
                tap.context = None

        return _read_blocks

    def _read_done(self, read: Read) -> None:
        if self.role is None and "decode" not in self.announced:
            self.announce("decode")
        self.writer.emit(self._transfer, read)

    def _wrap_reap(self, reap: Any) -> Any:
        worker = self.worker

        def _reap_expired_send_leases(*args: Any, **kwargs: Any) -> Any:
            leases = worker._reqs_to_send
            before = set(leases) if leases else None
            result = reap(*args, **kwargs)
            if before:
                try:
                    gone = before.difference(worker._reqs_to_send)
                    if gone:
                        self._released(gone)
                except Exception as error:
                    say_once("reap", "cannot trace expired leases (%r)", error)
            return result

        return _reap_expired_send_leases

    def _released(self, request_ids: set[str]) -> None:
        if self.role is None:
            self.announce("prefill")
        now = time.time()
        for request_id in request_ids:
            self.writer.emit(_release, now, self.engine_id, self.rank, request_id)

    def _wrap_notifs(self, get_new_notifs: Any) -> Any:
        def _get_new_notifs(*args: Any, **kwargs: Any) -> Any:
            sent = get_new_notifs(*args, **kwargs)
            if sent and "prefill" not in self.announced:
                self.guard("notifs", self.announce, "prefill")
            return sent

        return _get_new_notifs

    # -- the writer's thread ------------------------------------------------------------------

    def _transfer(self, read: Read) -> dict:
        request_id, engine, remote_request_id, remote_rank, local_blocks = read.context or (None,) * 5
        facts = read_facts(read)
        if remote_request_id is not None:
            facts["remote_request_id"] = remote_request_id
        ok = facts["status"] == "ok"
        groups, exact = self._split(read, local_blocks, facts["transported_bytes"] if ok else None)
        remote_agent = None
        with contextlib.suppress(Exception):
            remote_agent = self.worker._remote_agents[engine][(0, remote_rank)]
            if isinstance(remote_agent, bytes):  # NIXL returns agent names as bytes
                remote_agent = remote_agent.decode(errors="replace")
        # with a host buffer the read lands in host memory and is copied to the device after
        staged = facts["transported_bytes"] if ok and getattr(self.worker, "use_host_buffer", False) else 0
        return records.transfer_record(
            request_id=request_id, engine_id=self.engine_id, remote_engine_id=engine, rank=self.rank,
            tp_size=self.tp_size, remote_rank=remote_rank, remote_tp_size=self.remote_tp.get(engine),
            staging_bytes=staged, groups=groups, groups_exact=exact, remote_agent_name=remote_agent,
            **facts,
        )

    def _split(self, read: Read, local_blocks: Any, total: int | None) -> tuple[list[dict] | None, bool]:
        """Blocks, bytes and descriptors per group, from the descriptor ids the read posted.

        vLLM lays a local descriptor list out as attention descriptors region by region
        (``num_blocks`` each), then the Mamba descriptors (``logical blocks`` per region); a
        descriptor's block id is its place within its region, and its group is the group
        of this request whose block ids hold it.
        """
        if self.layout is None or local_blocks is None:
            return None, False
        handle, regions, logical_blocks = self.layout
        lengths = self.tap.dlists.get(read.local)
        if read.local is not handle or lengths is None:
            return None, False  # a split handle (heterogeneous TP): no per-group view
        import numpy as np

        ids = np.asarray(read.indices, dtype=np.int64)
        offsets = [0, *itertools.accumulate(regions)]
        attention_descs = offsets[-1]
        # which group holds each descriptor's block: attention and Mamba descriptors are
        # looked up among their own kind's groups (a block id names a page of either)
        owner = {}
        for (gid, kind, _), blocks in zip(self.groups, local_blocks, strict=False):
            state = kind == "mamba"
            for block in blocks:
                owner[state, block] = gid
        per_group: dict[int, list] = {}
        unplaced = 0
        # one pass in Python: reads post tens to thousands of descriptors, where numpy's
        # per-call cost is more than the work
        for desc, length in zip(ids.tolist(), lengths[ids].tolist(), strict=True):
            if desc < attention_descs:
                key = (False, desc - offsets[bisect.bisect_right(offsets, desc) - 1])
            else:
                key = (True, (desc - attention_descs) % max(logical_blocks, 1))
            gid = owner.get(key)
            if gid is None:
                unplaced += 1
                continue
            entry = per_group.get(gid)
            if entry is None:
                entry = per_group[gid] = [set(), 0, 0]
            entry[0].add(key[1])
            entry[1] += length
            entry[2] += 1
        summary = {gid: (len(blocks), nbytes, count) for gid, (blocks, nbytes, count) in per_group.items()}
        return records.group_split(summary, unplaced, self.groups, total)


def _release(ts: float, engine_id: str, rank: int, request_id: str) -> dict:
    return records.release_record(ts=ts, engine_id=engine_id, rank=rank, request_id=request_id)


def _groups(config: Any) -> tuple[list[dict], dict[int, str]]:
    """The engine record's groups from a ``KVCacheConfig``, and each group's kind."""
    groups: list[dict] = []
    kinds: dict[int, str] = {}
    sizes = [len(group.layer_names) for group in config.kv_cache_groups]
    widest = max(sizes, default=0)
    for gid, group in enumerate(config.kv_cache_groups):
        spec = group.kv_cache_spec
        spec = next(iter(getattr(spec, "kv_cache_specs", {}).values()), spec)  # uniform-type groups
        name = type(spec).__name__
        if name.startswith("Mamba"):
            kind = "mamba"
        elif "SlidingWindow" in name:
            kind = "sliding_window"
        elif name.startswith("ChunkedLocal"):
            kind = "chunked_local"
        else:
            kind = "attention"
        kinds[gid] = kind
        entry: dict[str, Any] = {
            "group": gid,
            "kind": kind,
            "layers": sizes[gid],
            # the shared allocation gives every group as many layer slots as the widest one
            "padding_layers": widest - sizes[gid],
            "block_tokens": int(spec.block_size),
            "page_bytes": int(spec.page_size_bytes),
        }
        if kind == "mamba":
            entry["state_bytes"] = int(getattr(spec, "real_page_size_bytes", spec.page_size_bytes))
        groups.append(entry)
    return groups, kinds


def _engine_facts(vllm_config: Any, worker: Any, groups: list[dict], agent_name: str | None) -> dict:
    cache = vllm_config.cache_config
    model = vllm_config.model_config
    config = worker.kv_cache_config
    attention_dtype = mamba_dtypes = None
    for group in config.kv_cache_groups:
        spec = group.kv_cache_spec
        spec = next(iter(getattr(spec, "kv_cache_specs", {}).values()), spec)
        if type(spec).__name__.startswith("Mamba"):
            mamba_dtypes = mamba_dtypes or tuple(getattr(spec, "dtypes", ()))
        else:
            attention_dtype = attention_dtype or getattr(spec, "dtype", None)
    facts: dict[str, Any] = {
        "model": getattr(model, "served_model_name", None) or getattr(model, "model", None),
        "kv_cache_dtype": _dtype_name(attention_dtype),
        "kv_buffer_device": getattr(worker, "kv_buffer_device", None),
        "use_host_buffer": getattr(worker, "use_host_buffer", None),
        "agent_name": agent_name,
        "groups": groups,
        "kv_layout": getattr(worker, "kv_cache_layout", None),
        "hybrid_allocator": not vllm_config.scheduler_config.disable_hybrid_kv_cache_manager,
    }
    if isinstance(facts["model"], list):
        facts["model"] = facts["model"][0] if facts["model"] else None
    if mamba_dtypes:
        facts["mamba_cache_dtype"] = _dtype_name(mamba_dtypes[0])
        facts["mamba_ssm_cache_dtype"] = _dtype_name(mamba_dtypes[-1])
        facts["mamba_cache_mode"] = getattr(cache, "mamba_cache_mode", None)
        try:
            from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

            facts["conv_layout"] = "DS" if is_conv_state_dim_first() else "SD"
        except Exception:
            pass
    try:
        import vllm

        facts["vllm_version"] = vllm.__version__
    except Exception:
        pass
    return {key: value for key, value in facts.items() if value is not None}


class _SchedulerTrace(_Trace):
    """The scheduler: one ``request`` record per decode-side request whose KV is done."""

    def __init__(self, connector: Any, vllm_config: Any, directory: str) -> None:
        self.connector = connector
        self.engine_id = str(connector.engine_id)
        self.scheduler = connector.connector_scheduler
        self.writer = TraceWriter(directory, engine_id=self.engine_id, role=_role(connector) or "both",
                                  rank=None, part_bytes=_part_bytes(connector))
        self.pending: dict[str, dict] = {}
        config = getattr(connector, "kv_cache_config", None)
        self.mamba_positions: list[int] = []
        if config is not None:
            _, kinds = _groups(config)
            ids = list(getattr(config, "transfer_group_ids", range(len(config.kv_cache_groups))))
            self.mamba_positions = [i for i, gid in enumerate(ids) if kinds[gid] == "mamba"]

    def asked(self, request: Any, num_computed_tokens: int) -> dict | None:
        """Before the stock code: what the request asks of a remote prefill."""
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_prefill"):
            return None
        return {
            "prompt_tokens": len(request.prompt_token_ids or ()),
            "cached_tokens": int(num_computed_tokens),
            "remote_engine_id": params.get("remote_engine_id"),
            "remote_request_id": params.get("remote_request_id"),
        }

    def matched(self, request: Any, asked: dict, result: Any) -> None:
        count = result[0] if isinstance(result, tuple) else result
        if count is None:  # vLLM does not know yet; it asks again on a later step
            return
        asked["missing_tokens"] = int(count)
        self.pending[request.request_id] = asked

    def allocated(self, request: Any, num_external_tokens: int) -> None:
        facts = self.pending.get(request.request_id)
        if facts is None:
            return
        facts["transferred_tokens"] = int(num_external_tokens)
        need = getattr(self.scheduler, "_reqs_need_recv", {}).get(request.request_id)
        if need is not None and self.mamba_positions:
            local_blocks = need[1]
            facts["state_blocks"] = sum(len(local_blocks[i]) for i in self.mamba_positions
                                        if i < len(local_blocks))
        elif not self.mamba_positions:
            facts["state_blocks"] = 0

    def done(self, output: Any) -> None:
        finished = output.finished_recving or ()
        if not finished:
            return
        failed = set(getattr(output, "failed_recving", ()) or ())
        now = time.time()
        for request_id in finished:
            facts = self.pending.pop(request_id, None)
            if facts is not None:
                self.writer.emit(_request, now, self.engine_id, request_id, facts, request_id in failed)

    def forget(self, request: Any) -> None:
        self.pending.pop(request.request_id, None)


def _request(ts: float, engine_id: str, request_id: str, facts: dict, failed: bool) -> dict:
    prompt, cached = facts.get("prompt_tokens"), facts.get("cached_tokens")
    missing, moved = facts.get("missing_tokens"), facts.get("transferred_tokens")
    state_blocks = facts.get("state_blocks")
    ok = not failed and moved is not None
    return records.request_record(
        ts=ts, request_id=request_id, external_request_id=external_request_id(request_id),
        remote_request_id=facts.get("remote_request_id"), engine_id=engine_id,
        remote_engine_id=facts.get("remote_engine_id"), prompt_tokens=prompt, cached_tokens=cached,
        missing_tokens=missing,
        transferred_tokens=moved if ok else None,
        # vLLM resumes from every token it loaded; the rest of the prompt it prefills itself
        reused_tokens=moved if ok else None,
        recomputed_tokens=(prompt - cached - moved) if ok and None not in (prompt, cached) else None,
        state_blocks=state_blocks,
        boundary_tokens=cached + moved if ok and state_blocks and cached is not None else None,
        status="failed" if failed else "ok",
    )
