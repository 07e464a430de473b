"""Write a simulated deployment as a log bucket would hold it, plus its truth.

Layout::

    models/<model>/config.json
    prefill-0/vllm.log.1.gz (the older half, rotated), vllm.log, trace.jsonl
    decode-0/vllm.log.1.gz, vllm.log, trace.jsonl,
             metrics-<UTC stamp>.prom every scrape interval

Every line is in the exact shape vLLM or the connector prints it. Records are encoded
column-wise, files are written in a fixed order with fixed content (gzip without a
timestamp), so a seed gives the same bytes.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from hybridtrace.simulate.workload import REQUEST_KINDS, Deployment

LEVEL_COLOURS = {"DEBUG": "37", "INFO": "32", "WARNING": "33", "ERROR": "31", "CRITICAL": "35"}
XFER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
POST_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
BYTE_BUCKETS = tuple(2 ** (10 + i) for i in range(1, 25, 2))
DESC_BUCKETS = (10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000)
_TRANSFER_FIELDS = (
    "ts", "request_id", "remote_request_id", "engine_id", "remote_engine_id", "rank", "tp_size", "remote_rank",
    "remote_tp_size", "status", "post_s", "xfer_s", "bytes", "descriptors", "staging_bytes", "link", "groups",
)  # fmt: skip
_REQUEST_FIELDS = (
    "ts", "request_id", "remote_request_id", "engine_id", "remote_engine_id", "prompt_tokens", "cached_tokens",
    "missing_tokens", "transferred_tokens", "reused_tokens", "recomputed_tokens", "state_blocks", "boundary_tokens",
    "prefill_s", "status",
)  # fmt: skip


def _head(level: str, stamp: str, where: str, process: str, colour: bool) -> str:
    if colour:
        return (
            f"\x1b[0;36m({process})\x1b[0;0m \x1b[{LEVEL_COLOURS[level]}m{level}\x1b[0m "
            f"\x1b[90m{stamp}\x1b[0m \x1b[90m[{where}]\x1b[0m "
        )
    return f"({process}) {level} {stamp} [{where}] "


def _line(ts: float, message: str, *, level: str = "INFO", where: str, process: str, colour: bool) -> str:
    head = _head(level, datetime.fromtimestamp(ts, UTC).strftime("%m-%d %H:%M:%S"), where, process, colour)
    return "\r\n".join(head + part for part in message.split("\n"))


def _stamp(column: str) -> pl.Expr:
    return pl.from_epoch((pl.col(column) * 1e6).cast(pl.Int64), time_unit="us").dt.strftime("%m-%d %H:%M:%S")


def kv_metrics_line(row: dict) -> str:
    """The `KV Transfer metrics` message of one interval, rounded as vLLM rounds it."""
    n = row["n"]
    values = {
        "Num successful transfers": n,
        "Avg xfer time (ms)": round(row["xfer_sum"] / n * 1e3, 3),
        "P90 xfer time (ms)": round(row["xfer_p90"] * 1e3, 3),
        "Avg post time (ms)": round(row["post_sum"] / n * 1e3, 3),
        "P90 post time (ms)": round(row["post_p90"] * 1e3, 3),
        "Avg MB per transfer": round(row["bytes_sum"] / 2**20 / n, 3),
        "Throughput (MB/s)": round(row["bytes_sum"] / 2**20 / row["xfer_sum"], 3),
        "Avg number of descriptors": round(row["desc_sum"] / n, 1),
    }
    return "KV Transfer metrics: " + ", ".join(f"{k}={v}" for k, v in values.items())


def write_bundle(deployment: Deployment, out: Path) -> dict:
    """Write the bundle under ``out``; returns the counts the truth also records."""
    options = deployment.options
    out.mkdir(parents=True, exist_ok=True)
    if options.requests is not None and deployment.requests.height:
        last = deployment.requests["ts"].max()
        options = replace(options, duration_s=max(1.0, float(last) - options.start_ts + 1.0))
        deployment.options = options
    end = options.start_ts + options.duration_s + 5.0
    counts = {"transfers": 0, "requests": 0, "engines": 0, "log_intervals": 0, "prom_scrapes": 0}
    # The config sits in a folder named as the engines name their model.
    config_dir = out / "models" / deployment.model_name.rsplit("/", 1)[-1]
    config_dir.mkdir(parents=True, exist_ok=True)
    _write(config_dir / "config.json", (json.dumps(deployment.config, indent=2) + "\n").encode(), end)
    for engine in deployment.engines:
        folder = out / engine.engine_id
        folder.mkdir(exist_ok=True)
        key = "engine_id" if engine.role == "decode" else "remote_engine_id"
        requests = deployment.requests.filter(pl.col(key) == engine.engine_id)
        reads = deployment.reads.filter(pl.col(key) == engine.engine_id)
        header = json.dumps(_engine_record(deployment, engine), sort_keys=True)
        lines = pl.DataFrame({"line": [header]})
        if engine.role == "decode":
            lines = pl.concat([lines, _trace_lines(reads, requests)])
            counts["transfers"] += reads.height
            counts["requests"] += requests.height
        counts["engines"] += 1
        _write_lines(folder / "trace.jsonl", lines["line"], end)
        lines = _log_lines(deployment, engine, requests, reads, end, counts)
        half = len(lines) // 2
        rotated = ("\n".join(lines[:half]) + "\n").encode()
        _write(
            folder / "vllm.log.1.gz",
            gzip.compress(rotated, mtime=0),
            options.start_ts + options.duration_s / 2,
        )
        _write(folder / "vllm.log", ("\n".join(lines[half:]) + "\n").encode(), end)
        if engine.role == "decode":
            _write_scrapes(deployment, reads, folder, counts)
    return counts


def _write(path: Path, data: bytes, mtime: float) -> None:
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))


def _write_lines(path: Path, lines: pl.Series, mtime: float, *, compress: bool = False) -> None:
    """Write ``lines`` newline-terminated, a slice at a time (never one giant string)."""
    # gzip without a timestamp, so the same lines give the same bytes
    handle = gzip.GzipFile(path, "wb", mtime=0) if compress else open(path, "wb")  # noqa: SIM115
    with handle:
        for start in range(0, lines.len(), 200_000):
            handle.write((lines.slice(start, 200_000).str.join("\n").item() + "\n").encode())
    os.utime(path, (mtime, mtime))


def _trace_lines(reads: pl.DataFrame, requests: pl.DataFrame) -> pl.DataFrame:
    record_type = pl.lit(None, pl.String)
    transfers = reads.select(
        pl.col("ts"),
        pl.lit(0).alias("order"),
        pl.struct(record_type.fill_null("transfer").alias("type"), pl.lit(1).alias("v"), *_TRANSFER_FIELDS)
        .struct.json_encode()
        .alias("line"),
    )
    asked = requests.select(
        pl.col("ts"),
        pl.lit(1).alias("order"),
        pl.struct(record_type.fill_null("request").alias("type"), pl.lit(1).alias("v"), *_REQUEST_FIELDS)
        .struct.json_encode()
        .alias("line"),
    )
    return pl.concat([transfers, asked]).sort(["ts", "order"], maintain_order=True).select("line")


def _engine_record(deployment: Deployment, engine) -> dict:
    model = deployment.byte_models[engine.engine_id]
    groups = [
        {"group": 0, "kind": "attention", "layers": model.attention_layers, "padding_layers": 0,
         "block_tokens": model.block_tokens, "page_bytes": model.attention_page_bytes},
        {"group": 1, "kind": "mamba", "layers": model.recurrent_layers, "padding_layers": 0,
         "block_tokens": model.block_tokens, "page_bytes": model.mamba_padded_page_bytes,
         "state_bytes": model.mamba_page_bytes},
    ]  # fmt: skip
    return {
        "type": "engine",
        "v": 1,
        "ts": deployment.options.start_ts - 60,
        "engine_id": engine.engine_id,
        "role": engine.role,
        "model": deployment.model_name,
        "tp_size": engine.tp_size,
        "kv_cache_dtype": model.kv_cache_dtype,
        "kv_buffer_device": "cuda",
        "mamba_cache_dtype": model.mamba_cache_dtype,
        "mamba_ssm_cache_dtype": model.mamba_ssm_cache_dtype,
        "hybrid_allocator": True,
        "groups": groups,
    }


def _tick(column: str, start: float, every: float) -> pl.Expr:
    """The index of the periodic tick at or after ``column`` (tick k is at start + k * every)."""
    return ((pl.col(column) - start) / every).ceil().cast(pl.Int64).clip(1)


def _log_lines(
    deployment: Deployment, engine, requests: pl.DataFrame, reads: pl.DataFrame, end: float, counts: dict
) -> list[str]:
    options = deployment.options
    colour = options.colour
    model = deployment.byte_models[engine.engine_id]
    start = options.start_ts - 60
    events: list[tuple[float, int, str]] = []

    def add(ts: float, message: str, **kw) -> None:
        events.append((ts, len(events), _line(ts, message, colour=colour, **kw)))

    api, core = "APIServer pid=1", "EngineCore_DP0 pid=212"
    worker = [f"Worker_TP{r} pid={300 + r}" for r in range(engine.tp_size)] if engine.tp_size > 1 else [core]
    if model.block_tokens and model.mamba_padding_pct is not None:
        add(
            start,
            f"Setting attention block size to {model.block_tokens} tokens to ensure that attention page size is >= mamba page size.",
            where="interface.py:911",
            process=api,
        )
        add(
            start,
            f"Padding mamba page size by {model.mamba_padding_pct:.2f}% to ensure that mamba page size and attention page size are exactly equal.",
            where="interface.py:935",
            process=api,
        )
    add(start + 5, f"Initializing NIXL worker {engine.engine_id}", where="worker.py:210", process=worker[0])
    groups = model.kv_cache_groups
    if groups and groups.padding_layers:
        add(
            start + 8,
            f"Add {groups.padding_layers} padding layers, may waste at most {groups.padding_pct:.2f}% KV cache memory",
            level="WARNING",
            where="kv_cache_utils.py:1152",
            process=core,
        )
    add(
        start + 9,
        "GPU KV cache size: 1,234,512 tokens, Maximum concurrency for 131,072 tokens per request: 9.42x",
        where="kv_cache_utils.py:1882",
        process=core,
    )
    for proc in worker:
        add(
            start + 10,
            "Registering KV_Caches. use_mla: False, kv_buffer_device: cuda, use_host_buffer: False",
            where="worker.py:640",
            process=proc,
        )
        if model.conv_bytes_per_layer is not None:
            add(
                start + 10,
                f"Hybrid SSM registration: num_blocks=20000, logical_num_blocks=1000, ratio=20, num_regions=12, num_descs=480000, mamba_ssm_size=({model.conv_bytes_per_layer}, {model.ssm_bytes_per_layer}), block_len_per_layer={{{(model.attention_page_bytes or 0) // 20}}}",
                where="worker.py:781",
                process=proc,
            )
    if "config_mismatch" in options.inject and engine.role == "decode" and engine.engine_id == "decode-0":
        add(
            start + 20,
            'Traceback (most recent call last):\n  File "worker.py", line 434, in _nixl_handshake\nRuntimeError: NIXL compatibility hash mismatch. Local: 7a1c0e, Remote: 93bd42',
            level="ERROR",
            where="worker.py:434",
            process=worker[0],
        )
    else:
        add(
            start + 20,
            "NIXL compatibility check passed (hash: 7a1c0e5b)",
            where="worker.py:434",
            process=worker[-1],
        )
    interval = options.stats_interval_s
    n_ticks = math.ceil((end - options.start_ts) / interval)
    if engine.role == "decode":
        stats = (
            reads.filter(pl.col("status") == "ok")
            .with_columns(_tick("done_ts", options.start_ts, interval).alias("k"))
            .group_by("k", maintain_order=True)
            .agg(
                pl.len().alias("n"),
                pl.col("xfer_s").sum().alias("xfer_sum"),
                pl.col("xfer_s").quantile(0.9, "linear").alias("xfer_p90"),
                pl.col("post_s").sum().alias("post_sum"),
                pl.col("post_s").quantile(0.9, "linear").alias("post_p90"),
                pl.col("bytes").sum().alias("bytes_sum"),
                pl.col("descriptors").sum().alias("desc_sum"),
            )
        )
        by_tick = {row["k"]: row for row in stats.iter_rows(named=True)}
        arrivals = (
            requests.with_columns(_tick("ts", options.start_ts, interval).alias("k"))
            .group_by("k")
            .agg(pl.len().alias("running"), pl.col("recomputed_tokens").sum().alias("recomputed"))
        )
        load = {k: (r, t) for k, r, t in arrivals.iter_rows()}
        for k in range(1, n_ticks + 1):
            tick = options.start_ts + k * interval
            running, recomputed = load.get(k, (0, 0))
            add(
                tick,
                f"Engine 000: Avg prompt throughput: {recomputed / interval:.1f} tokens/s, Avg generation throughput: {running * 40 / interval:.1f} tokens/s, Running: {running} reqs, Waiting: 0 reqs, GPU KV cache usage: 3.1%, Prefix cache hit rate: 0.0%",
                where="loggers.py:236",
                process=api,
            )
            if k in by_tick:
                add(tick, kv_metrics_line(by_tick[k]), where="metrics.py:103", process=api)
                counts["log_intervals"] += 1
        failed = reads.filter(pl.col("status") == "failed").select(
            "done_ts", "request_id", "engine_id", "remote_engine_id", "remote_request_id", "rank"
        )
        for done, rid, eid, remote, remote_rid, rank in failed.iter_rows():
            context = {"failure_type": "transfer_failed", "request_id": rid, "engine_id": eid,
                       "remote_engine_id": remote, "remote_request_id": remote_rid, "remote_host": "10.0.12.7",
                       "remote_port": 5600, "num_local_blocks": 12, "num_remote_blocks": 12, "xfer_state": "ERR"}  # fmt: skip
            add(
                done,
                f"NIXL transfer failure: transfer_failed. Marking blocks as invalid | Context: {context!r}",
                level="ERROR",
                where="worker.py:505",
                process=worker[min(rank, len(worker) - 1)],
            )
    else:
        expired = requests.filter(pl.col("status") == "expired").select("ts", "remote_request_id")
        for ts, remote_rid in expired.iter_rows():
            if options.era == "abort":
                text = f"Releasing expired KV blocks for request {remote_rid} which were retrieved by 0 decode worker(s) within 480 seconds."
            else:
                text = f"Releasing expired KV blocks for request {remote_rid} which were retrieved by 0 remote worker(s) before lease expired."
            add(ts + 30, text, level="WARNING", where="base_worker.py:2152", process=worker[0])
        arrivals = (
            requests.with_columns(_tick("ts", options.start_ts, interval).alias("k"))
            .group_by("k")
            .agg(pl.col("prompt_tokens").sum().alias("tokens"))
        )
        tokens_by_tick = dict(arrivals.iter_rows())
        for k in range(1, n_ticks + 1):
            tokens = tokens_by_tick.get(k, 0)
            add(
                options.start_ts + k * interval,
                f"Engine 000: Avg prompt throughput: {tokens / interval:.1f} tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.4%, Prefix cache hit rate: 0.0%",
                where="loggers.py:236",
                process=api,
            )
    # one access-log line per request: the bulk of a real log, of no interest to hybridtrace
    head = _head("INFO", "{}", "api_server.py:1019", api, colour).replace("{}", "\x00")
    before, after = head.split("\x00")
    access = requests.select(
        pl.col("ts"),
        pl.format(
            '{}{}{}10.0.0.{}:41234 - "POST /v1/completions HTTP/1.1" 200 OK',
            pl.lit(before), _stamp("ts"), pl.lit(after), (pl.col("n") % 200).cast(pl.String),
        ).alias("line"),
    ).with_columns(pl.int_range(len(events), len(events) + pl.len(), dtype=pl.Int64).alias("seq"))  # fmt: skip
    fixed = pl.DataFrame(events, schema={"ts": pl.Float64, "seq": pl.Int64, "line": pl.String}, orient="row")
    return pl.concat([fixed, access.select("ts", "seq", "line")]).sort(["ts", "seq"])["line"]


def _histogram_lines(
    name: str, bounds, values: pl.Series, ticks: pl.Series, n_ticks: int, labels: str
) -> list[list[str]]:
    """Cumulative histogram lines of ``values`` at every scrape tick, as vLLM exports them."""
    frame = pl.DataFrame({"v": values.cast(pl.Float64), "k": ticks})
    bucket = pl.Series([float(b) for b in bounds]).search_sorted(frame["v"], side="left")
    frame = frame.with_columns(bucket.alias("b"))
    grid = [[0] * (len(bounds) + 1) for _ in range(n_ticks + 1)]
    sums = [0.0] * (n_ticks + 1)
    for k, b, count, total in (
        frame.group_by(["k", "b"]).agg(pl.len(), pl.col("v").sum()).sort(["k", "b"]).iter_rows()
    ):
        if k <= n_ticks:
            grid[k][b] += count
            sums[k] += total
    out = []
    running = [0] * (len(bounds) + 1)
    running_sum = 0.0
    for k in range(1, n_ticks + 1):
        for b in range(len(bounds) + 1):
            running[b] += grid[k][b]
        running_sum += sums[k]
        lines = [f"# HELP {name} {name.split(':')[-1]}", f"# TYPE {name} histogram"]
        cumulative = 0
        for b, bound in enumerate(bounds):
            cumulative += running[b]
            lines.append(f'{name}_bucket{{{labels},le="{float(bound)}"}} {float(cumulative)}')
        total = cumulative + running[len(bounds)]
        lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(total)}')
        lines.append(f"{name}_count{{{labels}}} {float(total)}")
        lines.append(f"{name}_sum{{{labels}}} {running_sum!r}")
        out.append(lines)
    return out


def _write_scrapes(deployment: Deployment, reads: pl.DataFrame, folder: Path, counts: dict) -> None:
    options = deployment.options
    labels = f'engine="0",model_name="{deployment.model_name}"'
    every = options.scrape_interval_s
    n_ticks = int((options.duration_s + 5) // every)
    ok = reads.filter(pl.col("status") == "ok").with_columns(
        _tick("done_ts", options.start_ts, every).alias("k")
    )
    ticks = ok["k"]
    parts = [
        _histogram_lines("vllm:nixl_xfer_time_seconds", XFER_BUCKETS, ok["xfer_s"], ticks, n_ticks, labels),
        _histogram_lines("vllm:nixl_post_time_seconds", POST_BUCKETS, ok["post_s"], ticks, n_ticks, labels),
        _histogram_lines("vllm:nixl_bytes_transferred", BYTE_BUCKETS, ok["bytes"], ticks, n_ticks, labels),
        _histogram_lines(
            "vllm:nixl_num_descriptors", DESC_BUCKETS, ok["descriptors"], ticks, n_ticks, labels
        ),
    ]
    failed_ticks = reads.filter(pl.col("status") == "failed").select(
        _tick("done_ts", options.start_ts, every)
    )
    failed_by_tick = dict(failed_ticks.group_by("done_ts").len().iter_rows())
    failed = 0
    for k in range(1, n_ticks + 1):
        tick = options.start_ts + k * every
        failed += failed_by_tick.get(k, 0)
        lines = ["# vLLM /metrics"]
        for part in parts:
            lines += part[k - 1]
        lines.append("# TYPE vllm:nixl_num_failed_transfers counter")
        lines.append(f"vllm:nixl_num_failed_transfers_total{{{labels}}} {float(failed)}")
        stamp = datetime.fromtimestamp(tick, UTC).strftime("%Y%m%dT%H%M%SZ")
        _write(folder / f"metrics-{stamp}.prom", ("\n".join(lines) + "\n").encode(), tick)
        counts["prom_scrapes"] += 1


__all__ = ["REQUEST_KINDS", "kv_metrics_line", "write_bundle"]
