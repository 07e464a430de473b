"""Requests and NIXL reads of a simulated P/D deployment, generated column-wise.

Each request's missing prefix decides its bytes through the byte model of the decode
engine's TP: attention blocks move whole (``ceil(T / block) * block * B``) and the
recurrent state moves unpadded (``S * J``), split evenly over the reads a decode rank
makes when the prefill engine has more ranks (vLLM's tp_ratio routing). Times follow a
link model — fixed cost, descriptor posting, bytes over a jittered bandwidth — and a
read's completion is seen only at the next engine step, as vLLM polls, so ``xfer_s``
carries that delay. Injected faults change exactly the records they concern and are
listed in the truth.

Everything is a polars expression over all requests or reads at once, with random draws
from hashing (seed, stream, row): a million requests take seconds, and a seed gives the
same bundle.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass

import polars as pl

from hybridtrace.analyze.rules import KINDS_BY_NAME
from hybridtrace.model import ByteModel, SizingOptions, geometry_from_config, load_config, size_model
from hybridtrace.simulate.scenario import EngineSpec, SimOptions

KERNEL_BLOCK = 16  # physical attention block: descriptors are per kernel block
# What each injected fault is, in the words of the demo's answer key; its severity is the
# rule registry's (analyze/rules.py).
_MESSAGES = {
    "padding_leak": "the recurrent state crossed as padded allocator pages",
    "staging_copy": "the read went through a host staging buffer",
    "useless_boundary": "KV moved past the boundary the decoder could resume from",
    "descriptor_bound": "posting descriptors dominated the transfer",
    "kv_expired": "the prefill engine released the blocks before they were read",
    "transfer_failed": "a NIXL read failed",
    "unsharded_state": "a decode rank pulled the whole recurrent state, not its shard",
    "recompute_cheaper": "the handoff took longer than prefilling the missing prefix",
}
REQUEST_KINDS = tuple(_MESSAGES)
# The smallest per-read padding gap a padding leak is injected for: above the analyzer's
# default slack (excess_min_bytes), so every injected leak is one it can see.
PADDING_VISIBLE_BYTES = 4096
# The slow rank's path: a tenth of its peers' link bandwidth, and two engine steps of added
# latency. Completions are seen only at engine steps, which hides a bandwidth loss on small
# reads (a small model's state crosses within one step either way); the latency keeps the
# rank below the analyzer's default ratio (0.6) on every model.
SLOW_RANK_BANDWIDTH = 0.1
SLOW_RANK_DELAY_STEPS = 2


@dataclass
class Plan:
    """The deployment: engines and their byte models; requests come in blocks."""

    options: SimOptions
    model_name: str
    config: dict
    engines: list[EngineSpec]
    byte_models: dict[str, ByteModel]  # by engine_id, at the engine's TP
    rate: float  # requests per second

    @property
    def prefills(self) -> list[EngineSpec]:
        return [e for e in self.engines if e.role == "prefill"]

    @property
    def decodes(self) -> list[EngineSpec]:
        return [e for e in self.engines if e.role == "decode"]


@dataclass
class Block:
    requests: pl.DataFrame  # one row per request (trace `request` fields + internals)
    reads: pl.DataFrame  # one row per NIXL read (trace `transfer` fields + done_ts)
    findings: pl.DataFrame  # kind, injected, line (JSON)
    last: bool


def uniform(seed: int, stream: int, n: int, offset: int = 0) -> pl.Series:
    """Draws ``offset .. offset + n`` in [0, 1) of (seed, stream): the same in any block size."""
    hashed = pl.int_range(offset, offset + n, eager=True, dtype=pl.UInt64).hash(seed * 1_000_003 + stream)
    return ((hashed // (1 << 11)).cast(pl.Float64) / float(1 << 53)).alias("u")


def normal(seed: int, stream: int, n: int, offset: int = 0) -> pl.Series:
    """Standard normal draws (Box-Muller over two uniform streams)."""
    u1 = uniform(seed, stream, n, offset).clip(1e-12, 1.0)
    u2 = uniform(seed, stream + 1, n, offset)
    return ((-2.0 * u1.log()).sqrt() * (2 * math.pi * u2).cos()).alias("z")


def _finding(kind: str, engine_id: str, **fields: object) -> dict:
    message = _MESSAGES.get(kind, "")
    severity = KINDS_BY_NAME[kind].severity if kind in KINDS_BY_NAME else "warning"
    out = {
        "kind": kind,
        "severity": fields.pop("severity", severity),
        "engine_id": engine_id,
        "rank": fields.pop("rank", None),
        "request_id": fields.pop("request_id", None),
        "remote_engine_id": fields.pop("remote_engine_id", None),
        "start_ts": None,
        "end_ts": None,
        "message": fields.pop("message", message),
        "evidence": {**fields.pop("evidence", {}), "injected": fields.pop("injected", True)},
    }
    return out


def prepare(options: SimOptions) -> Plan:
    """Engines and byte models of the simulated deployment."""
    config, name = load_config(options.model)
    geometry = geometry_from_config(config, name)
    engines = options.engines()
    if "config_mismatch" in options.inject:
        # One pair disagrees on the KV dtype: the first prefill engine runs fp8 KV.
        first = next(e for e in engines if e.role == "prefill")
        engines = [EngineSpec(e.engine_id, e.role, e.tp_size, "fp8") if e is first else e for e in engines]
    byte_models = {
        e.engine_id: size_model(
            geometry, SizingOptions(tp_size=e.tp_size, kv_dtype=e.kv_dtype, ssm_dtype=options.ssm_dtype)
        )
        for e in engines
    }
    rate = options.requests / options.duration_s if options.requests is not None else options.request_rate
    return Plan(options, name, config, engines, byte_models, rate)


def blocks(plan: Plan, size: int = 100_000) -> Iterator[Block]:
    """The workload, ``size`` requests at a time, in arrival order; deterministic for a seed."""
    options = plan.options
    end = options.start_ts + options.duration_s
    offset, read_offset, arrival = 0, 0, options.start_ts
    while True:
        count = size if options.requests is None else min(size, options.requests - offset)
        requests = _requests(plan, offset, count, arrival)
        last = count < size or (options.requests is not None and offset + count >= options.requests)
        if options.requests is None:
            kept = requests.filter(pl.col("arrival") < end)
            last = last or kept.height < requests.height
            requests = kept
        if requests.height:
            arrival = float(requests["arrival"][-1])
            reads = _reads(plan, requests, read_offset)
            requests = _settle(requests, reads)
            yield Block(requests, reads, _findings(requests), last)
            read_offset += reads.height
        elif last:
            yield Block(requests, pl.DataFrame(), _findings(requests), True)
        offset += count
        if last:
            return


def _request_id(prefix: str, suffix: str) -> pl.Expr:
    """vLLM-style ids: request number, then a random suffix (prefill and decode ids differ)."""
    number = pl.col("n").cast(pl.String).str.zfill(7)
    return pl.format("{}{}-0-{}", pl.lit(prefix), number, pl.col(suffix).cast(pl.String).str.zfill(10))


def _requests(plan: Plan, offset: int, count: int, previous_arrival: float) -> pl.DataFrame:
    options = plan.options
    seed = options.seed
    prefills, decodes, byte_models = plan.prefills, plan.decodes, plan.byte_models
    gaps = -(1.0 - uniform(seed, 1, count, offset)).log() / plan.rate
    frame = pl.DataFrame({"arrival": previous_arrival + gaps.cum_sum()}).with_columns(
        pl.int_range(offset, offset + count, dtype=pl.UInt32).alias("n")
    )
    n = frame.height
    decode_table = pl.DataFrame(
        {
            "d_index": list(range(len(decodes))),
            "engine_id": [e.engine_id for e in decodes],
            "tp_size": [e.tp_size for e in decodes],
            "block": [byte_models[e.engine_id].block_tokens or KERNEL_BLOCK for e in decodes],
            "b_token": [byte_models[e.engine_id].attention_bytes_per_token for e in decodes],
            "s_bytes": [byte_models[e.engine_id].state_bytes for e in decodes],
            "padded_state": [
                (byte_models[e.engine_id].mamba_padded_page_bytes or 0)
                * (byte_models[e.engine_id].recurrent_layers or 0)
                for e in decodes
            ],
            "attn_layers": [byte_models[e.engine_id].attention_layers or 0 for e in decodes],
            "rec_layers": [byte_models[e.engine_id].recurrent_layers or 0 for e in decodes],
        },
        schema_overrides={"d_index": pl.UInt32, "tp_size": pl.Int32},
    )
    prefill_table = pl.DataFrame(
        {
            "p_index": list(range(len(prefills))),
            "remote_engine_id": [e.engine_id for e in prefills],
            "remote_tp_size": [e.tp_size for e in prefills],
        },
        schema_overrides={"p_index": pl.UInt32, "remote_tp_size": pl.Int32},
    )
    z = normal(seed, 2, n, offset)
    prompt = (math.log(options.median_prompt_tokens) + options.prompt_sigma * z).exp()
    frame = frame.with_columns(
        prompt.clip(32, options.max_prompt_tokens).cast(pl.Int64).alias("prompt_tokens"),
        (uniform(seed, 4, n, offset) < options.cache_hit_rate).alias("hit"),
        uniform(seed, 5, n, offset).alias("u_cached"),
        (pl.col("n") % len(decodes)).cast(pl.UInt32).alias("d_index"),
        (pl.col("n") % len(prefills)).cast(pl.UInt32).alias("p_index"),
        (uniform(seed, 6, n, offset) * 2**32).cast(pl.UInt64).alias("rid_a"),
        (uniform(seed, 7, n, offset) * 2**32).cast(pl.UInt64).alias("rid_b"),
        uniform(seed, 8, n, offset).alias("u_prefill"),
        uniform(seed, 9, n, offset).alias("u_rank"),
    )
    frame = frame.join(decode_table, on="d_index", how="left").join(prefill_table, on="p_index", how="left")
    block = pl.col("block")
    cached = (
        pl.when(pl.col("hit"))
        .then(
            pl.min_horizontal(
                (pl.col("prompt_tokens") * pl.col("u_cached")).cast(pl.Int64) // block * block,
                (pl.col("prompt_tokens") - 2) // block * block,
            ).clip(0)
        )
        .otherwise(0)
    )
    frame = frame.with_columns(cached.alias("cached_tokens")).with_columns(
        (pl.col("prompt_tokens") - 1 - pl.col("cached_tokens")).alias("missing_tokens")
    )
    stream = 20
    for kind in sorted(options.inject):
        if kind in REQUEST_KINDS:
            frame = frame.with_columns(
                (uniform(seed, stream, n, offset) < options.inject[kind]).alias(f"x_{kind}")
            )
        stream += 1
    for kind in REQUEST_KINDS:
        if f"x_{kind}" not in frame.columns:
            frame = frame.with_columns(pl.lit(False).alias(f"x_{kind}"))
    # A congested link would hide slow posting: a request gets one or the other. Padded
    # pages only leak where the allocator pads: a model whose state pages need no padding
    # (no attention layers to align with) moves the same bytes either way, so nothing leaks.
    share = pl.max_horizontal(pl.lit(1), pl.col("remote_tp_size") // pl.col("tp_size"))
    gap = (pl.col("padded_state") - pl.col("s_bytes")) // share
    frame = frame.with_columns(
        pl.col("x_recompute_cheaper") & ~pl.col("x_descriptor_bound"),
        pl.col("x_padding_leak") & (gap > PADDING_VISIBLE_BYTES),
        pl.col("x_unsharded_state") & (pl.col("s_bytes") > 0),  # no state, none to pull whole
    )
    prefix = f"cmpl-{options.seed:x}"
    useless = pl.col("x_useless_boundary")
    half = pl.col("missing_tokens") // 2
    return frame.with_columns(
        (pl.col("arrival") + 0.02).round(6).alias("ts"),
        _request_id(prefix, "rid_a").alias("request_id"),
        _request_id(prefix, "rid_b").alias("remote_request_id"),
        pl.col("missing_tokens").alias("transferred_tokens"),
        pl.when(useless).then(half).otherwise(pl.col("missing_tokens")).alias("reused_tokens"),
        pl.when(useless).then(pl.col("missing_tokens") - half + 1).otherwise(1).alias("recomputed_tokens"),
        pl.lit(1, pl.Int64).alias("state_blocks"),
        pl.when(useless)
        .then(pl.col("cached_tokens") + half)
        .otherwise(pl.col("cached_tokens") + pl.col("missing_tokens"))
        .alias("boundary_tokens"),
        (pl.col("missing_tokens") / options.prefill_tokens_per_s * (1 + 0.05 * pl.col("u_prefill")))
        .round(6)
        .alias("prefill_s"),
        # the prefill engine computes the prompt before the decoder can read it
        (pl.col("arrival") + pl.col("prompt_tokens") / (options.prefill_tokens_per_s * 2)).alias("post"),
        (pl.col("u_rank") * pl.col("tp_size")).cast(pl.Int32).alias("chosen_rank"),
    )


def _reads(plan: Plan, requests: pl.DataFrame, read_offset: int) -> pl.DataFrame:
    options = plan.options
    decodes = plan.decodes
    seed = options.seed
    frame = requests.select(
        "n",
        "ts",
        "post",
        "request_id",
        "remote_request_id",
        "engine_id",
        "remote_engine_id",
        "tp_size",
        "remote_tp_size",
        "missing_tokens",
        "block",
        "b_token",
        "s_bytes",
        "padded_state",
        "attn_layers",
        "rec_layers",
        "chosen_rank",
        *[f"x_{k}" for k in REQUEST_KINDS],
    )
    share = pl.max_horizontal(pl.lit(1), pl.col("remote_tp_size") // pl.col("tp_size"))
    frame = frame.with_columns(
        share.alias("share"), pl.int_ranges(0, pl.col("tp_size")).alias("rank")
    ).explode("rank")
    frame = frame.with_columns(pl.int_ranges(0, pl.col("share")).alias("part")).explode("part")
    ratio = pl.col("tp_size") // pl.col("remote_tp_size")
    remote_rank = (
        pl.when(pl.col("tp_size") >= pl.col("remote_tp_size"))
        .then(pl.col("rank") // ratio)
        .otherwise(pl.col("rank") * pl.col("share") + pl.col("part"))
    )
    m = frame.height
    blocks = (pl.col("missing_tokens") + pl.col("block") - 1) // pl.col("block")
    frame = frame.with_columns(
        remote_rank.cast(pl.Int32).alias("remote_rank"),
        pl.col("rank").cast(pl.Int32),
        blocks.alias("blocks"),
        normal(seed, 40, m, read_offset).alias("z_bw"),
        normal(seed, 42, m, read_offset).alias("z_fixed"),
    )
    attention = pl.col("blocks") * pl.col("block") * pl.col("b_token") // pl.col("share")
    state = pl.when(pl.col("x_unsharded_state") & (pl.col("rank") == pl.col("chosen_rank"))).then(
        pl.col("s_bytes") * pl.col("tp_size")
    ).when(pl.col("x_padding_leak")).then(pl.col("padded_state")).otherwise(pl.col("s_bytes")) // pl.col(
        "share"
    )
    state_descs = pl.col("rec_layers") * 2 // pl.col("share")
    descs = (pl.col("blocks") * (pl.col("block") // KERNEL_BLOCK) * pl.col("attn_layers") * 2) // pl.col(
        "share"
    ) + state_descs
    frame = frame.with_columns(
        attention.alias("attention"),
        state.alias("state"),
        descs.alias("base_descs"),
        state_descs.alias("state_descs"),
    )
    descriptor_bound = pl.col("x_descriptor_bound")
    descriptors = pl.when(descriptor_bound).then(pl.col("base_descs") * 40).otherwise(pl.col("base_descs"))
    post_s = 20e-6 + descriptors * options.post_s_per_descriptor * pl.when(descriptor_bound).then(
        25.0
    ).otherwise(1.0)
    bandwidth = options.bandwidth_gb_s * 1e9 * (options.bandwidth_jitter * pl.col("z_bw")).exp()
    slow = pl.lit(False)
    if options.inject.get("slow_rank") and decodes:
        slow = (pl.col("engine_id") == decodes[0].engine_id) & (pl.col("rank") == decodes[0].tp_size - 1)
        bandwidth = pl.when(slow).then(bandwidth * SLOW_RANK_BANDWIDTH).otherwise(bandwidth)
    bandwidth = pl.when(pl.col("x_recompute_cheaper")).then(bandwidth * 0.02).otherwise(bandwidth)
    frame = frame.with_columns(
        descriptors.alias("descriptors"),
        post_s.round(9).alias("post_s"),
        (pl.col("attention") + pl.col("state")).alias("bytes"),
        bandwidth.alias("bandwidth"),
    )
    poll = options.poll_interval_s
    fixed = options.fixed_cost_s * (options.fixed_cost_jitter * pl.col("z_fixed")).exp()
    fixed = fixed + pl.when(slow).then(SLOW_RANK_DELAY_STEPS * poll).otherwise(0.0)
    done = pl.col("post") + fixed + pl.col("post_s") + pl.col("bytes") / pl.col("bandwidth")
    seen = (done / poll).ceil() * poll + 1e-6  # completion is observed at the next engine step
    status = (
        pl.when(pl.col("x_kv_expired"))
        .then(pl.lit("expired"))
        .when(pl.col("x_transfer_failed") & (pl.col("rank") == pl.col("chosen_rank")))
        .then(pl.lit("failed"))
        .otherwise(pl.lit("ok"))
    )
    frame = frame.with_columns(
        pl.col("post").round(6).alias("ts"),
        (seen - pl.col("post")).round(9).alias("xfer_s"),
        status.alias("status"),
        pl.when(pl.col("x_staging_copy")).then(pl.col("bytes")).otherwise(0).alias("staging_bytes"),
        pl.lit("rdma:mlx5_0").alias("link"),
    )
    # The per-group split (attention blocks, the state) is kept as columns; the trace
    # writer turns them into the record's `groups` list.
    return frame.with_columns((pl.col("ts") + pl.col("xfer_s")).alias("done_ts")).select(
        "n",
        "ts",
        "request_id",
        "remote_request_id",
        "engine_id",
        "remote_engine_id",
        "rank",
        "tp_size",
        "remote_rank",
        "remote_tp_size",
        "status",
        "post_s",
        "xfer_s",
        "bytes",
        "descriptors",
        "staging_bytes",
        "link",
        "blocks",
        "attention",
        "state",
        "state_descs",
        "done_ts",
        *[f"x_{k}" for k in REQUEST_KINDS],
        "chosen_rank",
    )


def _settle(requests: pl.DataFrame, reads: pl.DataFrame) -> pl.DataFrame:
    """Each request's status and critical path (its slowest read, post to completion)."""
    ok = pl.col("status") == "ok"
    per_request = reads.group_by("n").agg(
        pl.col("xfer_s").max().alias("critical_s"),
        (pl.col("status") == "failed").any().alias("any_failed"),
        pl.col("post_s").filter(ok).sum().alias("post_sum"),
        pl.col("xfer_s").filter(ok).sum().alias("xfer_sum"),
    )
    status = (
        pl.when(pl.col("x_kv_expired"))
        .then(pl.lit("expired"))
        .when(pl.col("any_failed"))
        .then(pl.lit("failed"))
        .otherwise(pl.lit("ok"))
    )
    return requests.join(per_request, on="n", how="left", maintain_order="left").with_columns(
        status.alias("status")
    )


def global_findings(plan: Plan) -> list[dict]:
    """Findings about engines and ranks, not requests."""
    options, prefills, decodes = plan.options, plan.prefills, plan.decodes
    truth: list[dict] = []
    if options.inject.get("slow_rank") and decodes:
        truth.append(
            _finding(
                "slow_rank",
                decodes[0].engine_id,
                rank=decodes[0].tp_size - 1,
                message="decode rank reads at 30% of its peers' bandwidth",
            )
        )
    if "config_mismatch" in options.inject and prefills and decodes:
        truth.append(
            _finding(
                "config_mismatch",
                decodes[0].engine_id,
                remote_engine_id=prefills[0].engine_id,
                message="prefill runs fp8 KV, decode runs its model dtype",
                severity="error",
            )
        )
    return truth


def _json_text(column: str) -> pl.Expr:
    """A JSON string literal of ``column`` (ids and engine names need no escaping), or null."""
    return (
        pl.when(pl.col(column).is_null())
        .then(pl.lit("null"))
        .otherwise(pl.concat_str(pl.lit('"'), pl.col(column), pl.lit('"')))
    )


def _findings(requests: pl.DataFrame) -> pl.DataFrame:
    """Findings about the requests of one block, as (kind, injected, JSON line) rows.

    Written column-wise in the key order ``json.dumps(sort_keys=True)`` gives the global
    findings, so every line of truth.json reads alike.
    """
    # the columns a finding reads: filtering the whole block per kind would copy the rest
    requests = requests.select(
        "engine_id", "remote_engine_id", "request_id", "chosen_rank", "status", "critical_s", "prefill_s",
        "post_sum", "xfer_sum", *[f"x_{kind}" for kind in REQUEST_KINDS],
    )  # fmt: skip
    frames = []
    for kind in REQUEST_KINDS:
        # Only what the telemetry can show is true: an expired request's reads moved nothing
        # usable, so what only successful reads show cannot be seen on it (its staging bytes
        # and its boundary still can); a failed or expired request has no handoff time to
        # compare; the rank chosen to fail is the one chosen to pull the whole state.
        visible = pl.col(f"x_{kind}")
        if kind not in ("kv_expired", "staging_copy", "useless_boundary"):
            visible = visible & ~pl.col("x_kv_expired")
        if kind == "descriptor_bound":
            # a slow rank's long wait can outweigh the slow posting of the request's reads
            visible = visible & (pl.col("post_sum") >= 0.5 * pl.col("xfer_sum"))
        if kind == "recompute_cheaper":
            # a congested link on a small state may still beat prefilling a long prefix
            visible = visible & (pl.col("status") == "ok") & (pl.col("critical_s") > pl.col("prefill_s"))
        if kind == "unsharded_state":
            visible = visible & ~pl.col("x_transfer_failed")
        hits = requests.filter(visible)
        if not hits.height:
            continue
        message, severity = _MESSAGES[kind], KINDS_BY_NAME[kind].severity
        rank = (
            pl.col("chosen_rank").cast(pl.String)
            if kind in ("unsharded_state", "transfer_failed")
            else pl.lit("null")
        )
        frames.append(_finding_lines(hits, kind, severity, message, rank, pl.lit('{"injected":true}'), True))
    natural = requests.filter(
        ~pl.col("x_recompute_cheaper")
        & (pl.col("status") == "ok")
        & (pl.col("critical_s") > pl.col("prefill_s"))
    )
    if natural.height:
        evidence = pl.concat_str(
            pl.lit('{"critical_path_s":'), pl.col("critical_s").cast(pl.String),
            pl.lit(',"injected":false,"prefill_s":'), pl.col("prefill_s").cast(pl.String), pl.lit("}"),
        )  # fmt: skip
        message = "the handoff took longer than prefilling the missing prefix on the decoder"
        frames.append(
            _finding_lines(natural, "recompute_cheaper", "warning", message, pl.lit("null"), evidence, False)
        )
    # Posting can dominate without an injection (many small blocks on a fast link).
    posting = requests.filter(
        ~pl.col("x_descriptor_bound") & ~pl.col("x_kv_expired") & (pl.col("xfer_sum") > 0)
        & (pl.col("post_sum") / pl.col("xfer_sum") >= 0.5)
    )  # fmt: skip
    if posting.height:
        message, severity = _MESSAGES["descriptor_bound"], KINDS_BY_NAME["descriptor_bound"].severity
        frames.append(
            _finding_lines(
                posting,
                "descriptor_bound",
                severity,
                message,
                pl.lit("null"),
                pl.lit('{"injected":false}'),
                False,
            )
        )
    if not frames:
        return pl.DataFrame(schema={"kind": pl.String, "injected": pl.Boolean, "line": pl.String})
    return pl.concat(frames)


def _finding_lines(
    rows: pl.DataFrame,
    kind: str,
    severity: str,
    message: str,
    rank: pl.Expr,
    evidence: pl.Expr,
    injected: bool,
) -> pl.DataFrame:
    line = pl.concat_str(
        pl.lit('{"end_ts":null,"engine_id":'), _json_text("engine_id"),
        pl.lit(',"evidence":'), evidence,
        pl.lit(f',"kind":"{kind}","message":{json.dumps(message)},"rank":'), rank,
        pl.lit(',"remote_engine_id":'), _json_text("remote_engine_id"),
        pl.lit(',"request_id":'), _json_text("request_id"),
        pl.lit(f',"severity":"{severity}","start_ts":null}}'),
    )  # fmt: skip
    return rows.select(pl.lit(kind).alias("kind"), pl.lit(injected).alias("injected"), line.alias("line"))
