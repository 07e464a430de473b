"""Requests and NIXL reads of a simulated P/D deployment, physically consistent.

Each request's missing prefix decides its bytes through the byte model of the decode
engine's TP: attention blocks move whole (``ceil(T / block) * block * B``) and the
recurrent state moves unpadded (``S * J``), split evenly over the reads a decode rank
makes when the prefill engine has more ranks. Times follow a link model — fixed cost,
descriptor posting, bytes over a jittered bandwidth — and a read's completion is seen
only at the next engine step, as vLLM polls, so ``xfer_s`` carries that delay.
Injected faults change exactly the records they concern and are listed in the truth.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from hybridtrace.model import ByteModel, SizingOptions, geometry_from_config, load_config, size_model
from hybridtrace.model.geometry import ModelGeometry
from hybridtrace.simulate.scenario import EngineSpec, SimOptions

KERNEL_BLOCK = 16  # physical attention block: descriptors are per kernel block


@dataclass
class Read:
    ts: float
    request_id: str
    remote_request_id: str
    engine_id: str
    remote_engine_id: str
    rank: int
    tp_size: int
    remote_rank: int
    remote_tp_size: int
    status: str
    post_s: float
    xfer_s: float
    bytes: int
    descriptors: int
    staging_bytes: int
    link: str
    groups: list[dict]

    @property
    def done_ts(self) -> float:
        return self.ts + self.xfer_s

    def record(self) -> dict:
        out = {"type": "transfer", "v": 1, **self.__dict__}
        out["bytes"] = self.bytes
        return out


@dataclass
class Request:
    ts: float
    request_id: str
    remote_request_id: str
    engine_id: str
    remote_engine_id: str
    prompt_tokens: int
    cached_tokens: int
    missing_tokens: int
    transferred_tokens: int
    reused_tokens: int
    recomputed_tokens: int
    state_blocks: int
    boundary_tokens: int
    prefill_s: float
    status: str
    reads: list[Read] = field(default_factory=list)
    injected: list[str] = field(default_factory=list)

    def record(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k not in ("reads", "injected")}
        return {"type": "request", "v": 1, **out}


@dataclass
class Deployment:
    options: SimOptions
    model_name: str
    config: dict
    geometry: ModelGeometry
    engines: list[EngineSpec]
    byte_models: dict[str, ByteModel]  # by engine_id, at the engine's TP
    requests: list[Request]
    truth: list[dict]


def _sized(geometry: ModelGeometry, engine: EngineSpec, options: SimOptions) -> ByteModel:
    return size_model(
        geometry, SizingOptions(tp_size=engine.tp_size, kv_dtype=engine.kv_dtype, ssm_dtype=options.ssm_dtype)
    )


def _targets(rank: int, local_tp: int, remote_tp: int) -> list[int]:
    """Prefill ranks one decode rank reads from (vLLM's tp_ratio routing)."""
    if local_tp >= remote_tp:
        return [rank // (local_tp // remote_tp)]
    ratio = remote_tp // local_tp
    return [rank * ratio + i for i in range(ratio)]


def build(options: SimOptions) -> Deployment:
    """The deployment and every request of the workload, deterministic for a seed."""
    rng = random.Random(options.seed)
    config, name = load_config(options.model)
    geometry = geometry_from_config(config, name)
    engines = options.engines()
    if "config_mismatch" in options.inject:
        # One pair disagrees on the KV dtype: the prefill engine runs fp8 KV.
        prefill = next(e for e in engines if e.role == "prefill")
        engines = [EngineSpec(e.engine_id, e.role, e.tp_size, "fp8") if e is prefill else e for e in engines]
    byte_models = {e.engine_id: _sized(geometry, e, options) for e in engines}
    prefills = [e for e in engines if e.role == "prefill"]
    decodes = [e for e in engines if e.role == "decode"]
    truth: list[dict] = []
    slow = None
    if options.inject.get("slow_rank") and decodes:
        slow = (decodes[0].engine_id, decodes[0].tp_size - 1)
        truth.append(
            _finding(
                "slow_rank",
                decodes[0].engine_id,
                rank=slow[1],
                message="decode rank reads at 30% of its peers' bandwidth",
            )
        )
    if "config_mismatch" in options.inject and prefills and decodes:
        truth.append(
            _finding(
                "config_mismatch",
                decodes[0].engine_id,
                remote=prefills[0].engine_id,
                message="prefill runs fp8 KV, decode runs its model dtype",
                severity="error",
            )
        )
    requests: list[Request] = []
    ts = options.start_ts
    end = options.start_ts + options.duration_s
    n = 0
    while True:
        ts += rng.expovariate(options.request_rate)
        if (options.requests is None and ts >= end) or (
            options.requests is not None and n >= options.requests
        ):
            break
        p_engine = prefills[n % len(prefills)]
        d_engine = decodes[n % len(decodes)]
        request = _request(rng, options, n, ts, p_engine, d_engine, byte_models, slow, truth)
        requests.append(request)
        n += 1
    return Deployment(options, name, config, geometry, engines, byte_models, requests, truth)


def _finding(
    kind: str,
    engine_id: str,
    *,
    rank: int | None = None,
    request_id: str | None = None,
    remote: str | None = None,
    message: str = "",
    severity: str = "warning",
    evidence: dict | None = None,
    injected: bool = True,
) -> dict:
    return {
        "kind": kind,
        "severity": severity,
        "engine_id": engine_id,
        "rank": rank,
        "request_id": request_id,
        "remote_engine_id": remote,
        "start_ts": None,
        "end_ts": None,
        "message": message,
        "evidence": {**(evidence or {}), "injected": injected},
    }


def _request(
    rng: random.Random,
    options: SimOptions,
    n: int,
    ts: float,
    p_engine: EngineSpec,
    d_engine: EngineSpec,
    byte_models: dict[str, ByteModel],
    slow: tuple[str, int] | None,
    truth: list[dict],
) -> Request:
    model = byte_models[d_engine.engine_id]
    block = model.block_tokens or KERNEL_BLOCK
    prompt = int(
        min(
            options.max_prompt_tokens,
            max(32, rng.lognormvariate(math.log(options.median_prompt_tokens), options.prompt_sigma)),
        )
    )
    cached = 0
    if rng.random() < options.cache_hit_rate:
        # The decoder holds a prefix on block boundaries (prefix caching shares whole blocks).
        cached = min((int(prompt * rng.random()) // block) * block, max(0, (prompt - 2) // block * block))
    missing = prompt - 1 - cached  # vLLM's N-1 prefill: the decoder recomputes the last token
    rid = f"cmpl-{options.seed:x}{n:07d}-0-{rng.getrandbits(32):08x}"
    remote_rid = f"cmpl-{options.seed:x}{n:07d}-0-{rng.getrandbits(32):08x}"
    inject = [
        k
        for k, rate in sorted(options.inject.items())
        if k not in ("slow_rank", "config_mismatch") and rng.random() < rate
    ]
    prefill_s = missing / options.prefill_tokens_per_s * (1 + 0.05 * rng.random())
    reused, recomputed, boundary = missing, 1, cached + missing
    if "useless_boundary" in inject:
        # The state arrived for an earlier boundary than the attention KV: the tail the
        # decoder cannot resume from is prefilled again.
        boundary = cached + missing // 2
        reused = missing // 2
        recomputed = missing - reused + 1
    request = Request(
        ts=round(ts + 0.02, 6),
        request_id=rid,
        remote_request_id=remote_rid,
        engine_id=d_engine.engine_id,
        remote_engine_id=p_engine.engine_id,
        prompt_tokens=prompt,
        cached_tokens=cached,
        missing_tokens=missing,
        transferred_tokens=missing,
        reused_tokens=reused,
        recomputed_tokens=recomputed,
        state_blocks=1,
        boundary_tokens=boundary,
        prefill_s=round(prefill_s, 6),
        status="ok",
        injected=inject,
    )
    # The prefill engine computes the prompt first; the decoder reads once it is done.
    post = ts + prompt / (options.prefill_tokens_per_s * 2)
    failed_rank = rng.randrange(d_engine.tp_size) if "transfer_failed" in inject else None
    fat_rank = rng.randrange(d_engine.tp_size) if "unsharded_state" in inject else None
    congested = "recompute_cheaper" in inject
    for rank in range(d_engine.tp_size):
        targets = _targets(rank, d_engine.tp_size, p_engine.tp_size)
        for remote_rank in targets:
            share = len(targets)
            blocks = -(-missing // block)
            attention = blocks * block * model.attention_bytes_per_token // share
            state = model.state_bytes // share
            if "padding_leak" in inject:
                state = (model.mamba_padded_page_bytes or 0) * (model.recurrent_layers or 0) // share
            if fat_rank == rank:
                state = byte_models_tp1_state(model) // share
            kernel_blocks = blocks * (block // KERNEL_BLOCK)
            descriptors = (
                kernel_blocks * (model.attention_layers or 0) * 2 + (model.recurrent_layers or 0) * 2
            ) // share
            post_s = 20e-6 + descriptors * options.post_s_per_descriptor
            if "descriptor_bound" in inject:
                descriptors *= 40
                post_s = 20e-6 + descriptors * options.post_s_per_descriptor * 25
            bandwidth = options.bandwidth_gb_s * 1e9 * rng.lognormvariate(0, options.bandwidth_jitter)
            if slow == (d_engine.engine_id, rank):
                bandwidth *= 0.3
            if congested:
                bandwidth *= 0.02
            size = attention + state
            wire = options.fixed_cost_s + post_s + size / bandwidth
            # completion is observed at the next engine step after it happened
            done = post + wire
            seen = math.ceil(done / options.poll_interval_s) * options.poll_interval_s + 1e-6
            status = "ok"
            if failed_rank == rank:
                status = "failed"
            if "kv_expired" in inject:
                status = "expired"
            staging = size if "staging_copy" in inject else 0
            groups = [
                {
                    "group": 0,
                    "kind": "attention",
                    "blocks": blocks,
                    "bytes": attention,
                    "descriptors": descriptors - (model.recurrent_layers or 0) * 2 // share,
                },
                {
                    "group": 1,
                    "kind": "mamba",
                    "blocks": 1,
                    "bytes": state,
                    "descriptors": (model.recurrent_layers or 0) * 2 // share,
                },
            ]
            request.reads.append(
                Read(
                    ts=round(post, 6),
                    request_id=rid,
                    remote_request_id=remote_rid,
                    engine_id=d_engine.engine_id,
                    remote_engine_id=p_engine.engine_id,
                    rank=rank,
                    tp_size=d_engine.tp_size,
                    remote_rank=remote_rank,
                    remote_tp_size=p_engine.tp_size,
                    status=status,
                    post_s=round(post_s, 9),
                    xfer_s=round(seen - post, 9),
                    bytes=size,
                    descriptors=descriptors,
                    staging_bytes=staging,
                    link="rdma:mlx5_0",
                    groups=groups,
                )
            )
    if failed_rank is not None:
        request.status = "failed"
    if "kv_expired" in inject:
        request.status = "expired"
    critical = max(r.xfer_s for r in request.reads)
    for kind in inject:
        truth.append(_request_finding(kind, request, d_engine, fat_rank, failed_rank))
    if "recompute_cheaper" not in inject and request.status == "ok" and critical > request.prefill_s:
        truth.append(
            _finding(
                "recompute_cheaper",
                d_engine.engine_id,
                request_id=rid,
                remote=p_engine.engine_id,
                message="the handoff took longer than prefilling the missing prefix on the decoder",
                evidence={"critical_path_s": critical, "prefill_s": request.prefill_s},
                injected=False,
            )
        )
    return request


def byte_models_tp1_state(model: ByteModel) -> int:
    """State bytes of a rank that pulled every rank's shard: the unsharded state."""
    return model.state_bytes * model.tp_size


_MESSAGES = {
    "padding_leak": ("the recurrent state crossed as padded allocator pages", "warning"),
    "staging_copy": ("the read went through a host staging buffer", "warning"),
    "useless_boundary": ("KV moved past the boundary the decoder could resume from", "warning"),
    "descriptor_bound": ("posting descriptors dominated the transfer", "warning"),
    "kv_expired": ("the prefill engine released the blocks before they were read", "error"),
    "transfer_failed": ("a NIXL read failed", "error"),
    "unsharded_state": ("a decode rank pulled the whole recurrent state, not its shard", "warning"),
    "recompute_cheaper": ("the handoff took longer than prefilling the missing prefix", "warning"),
}


def _request_finding(
    kind: str, request: Request, engine: EngineSpec, fat_rank: int | None, failed_rank: int | None
) -> dict:
    message, severity = _MESSAGES[kind]
    rank = fat_rank if kind == "unsharded_state" else failed_rank if kind == "transfer_failed" else None
    return _finding(
        kind,
        engine.engine_id,
        rank=rank,
        request_id=request.request_id,
        remote=request.remote_engine_id,
        message=message,
        severity=severity,
    )
