"""Write a simulated deployment as a log bucket would hold it, plus its truth.

Layout::

    models/<model>/config.json
    prefill-0/vllm.log, trace.jsonl
    decode-0/vllm.log.1.gz (the older half, rotated), vllm.log, trace.jsonl,
             metrics-<UTC stamp>.prom every scrape interval
    truth.json

Every line is in the exact shape vLLM or the connector prints it. Files are written in a
fixed order with fixed content (gzip without a timestamp), so a seed gives the same bytes.
"""

from __future__ import annotations

import bisect
import gzip
import json
import math
import os
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from hybridtrace.simulate.workload import Deployment, Read

LEVEL_COLOURS = {"DEBUG": "37", "INFO": "32", "WARNING": "33", "ERROR": "31", "CRITICAL": "35"}
XFER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
POST_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
BYTE_BUCKETS = tuple(2 ** (10 + i) for i in range(1, 25, 2))
DESC_BUCKETS = (10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000)


def _line(ts: float, message: str, *, level: str = "INFO", where: str, process: str, colour: bool) -> str:
    stamp = datetime.fromtimestamp(ts, UTC).strftime("%m-%d %H:%M:%S")
    if colour:
        head = f"\x1b[{LEVEL_COLOURS[level]}m{level}\x1b[0m \x1b[90m{stamp}\x1b[0m \x1b[90m[{where}]\x1b[0m "
        prefix = f"\x1b[0;36m({process})\x1b[0;0m "
    else:
        head = f"{level} {stamp} [{where}] "
        prefix = f"({process}) "
    return "\r\n".join(prefix + head + part for part in message.split("\n"))


def percentile90(values: list[float]) -> float:
    """numpy's default (linear) 90th percentile, as vLLM computes it."""
    ordered = sorted(values)
    position = 0.9 * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def kv_metrics_values(reads: list[Read]) -> dict[str, float | int]:
    """The eight numbers of a `KV Transfer metrics` line, rounded as vLLM rounds them."""
    n = len(reads)
    xfer = [r.xfer_s for r in reads]
    post = [r.post_s for r in reads]
    total = sum(r.bytes for r in reads)
    return {
        "Num successful transfers": n,
        "Avg xfer time (ms)": round(sum(xfer) / n * 1e3, 3),
        "P90 xfer time (ms)": round(percentile90(xfer) * 1e3, 3),
        "Avg post time (ms)": round(sum(post) / n * 1e3, 3),
        "P90 post time (ms)": round(percentile90(post) * 1e3, 3),
        "Avg MB per transfer": round(total / 2**20 / n, 3),
        "Throughput (MB/s)": round(total / 2**20 / sum(xfer), 3),
        "Avg number of descriptors": round(sum(r.descriptors for r in reads) / n, 1),
    }


def _ticks(start: float, end: float, every: float) -> list[float]:
    count = int((end - start) // every) + 1
    return [start + every * k for k in range(1, count + 1)]


def write_bundle(deployment: Deployment, out: Path) -> dict:
    """Write the bundle under ``out``; returns the counts the truth also records."""
    options = deployment.options
    out.mkdir(parents=True, exist_ok=True)
    last = max((r.ts for r in deployment.requests), default=options.start_ts)
    if options.requests is not None:
        options = replace(options, duration_s=max(1.0, last - options.start_ts + 1.0))
        deployment.options = options
    end = options.start_ts + options.duration_s + 5.0
    counts = {"transfers": 0, "requests": 0, "engines": 0, "log_intervals": 0, "prom_scrapes": 0}
    # The config sits in a folder named as the engines name their model.
    config_dir = out / "models" / deployment.model_name.rsplit("/", 1)[-1]
    config_dir.mkdir(parents=True, exist_ok=True)
    _write(config_dir / "config.json", json.dumps(deployment.config, indent=2) + "\n", end)
    for engine in deployment.engines:
        folder = out / engine.engine_id
        folder.mkdir(exist_ok=True)
        mine = [r for r in deployment.requests if engine.engine_id in (r.engine_id, r.remote_engine_id)]
        reads = sorted(
            (x for r in mine if r.engine_id == engine.engine_id for x in r.reads), key=lambda x: x.ts
        )
        trace = [json.dumps(_engine_record(deployment, engine), sort_keys=True)]
        if engine.role == "decode":
            records = [(x.ts, x.record()) for x in reads] + [(r.ts, r.record()) for r in mine]
            records.sort(key=lambda item: item[0])
            trace += [json.dumps(rec, sort_keys=True) for _, rec in records]
            counts["transfers"] += len(reads)
            counts["requests"] += len(mine)
        counts["engines"] += 1
        _write(folder / "trace.jsonl", "\n".join(trace) + "\n", end)
        lines = _log_lines(deployment, engine, mine, reads, end, counts)
        half = len(lines) // 2
        rotated = ("\n".join(lines[:half]) + "\n").encode()
        _write_bytes(
            folder / "vllm.log.1.gz",
            gzip.compress(rotated, mtime=0),
            options.start_ts + options.duration_s / 2,
        )
        _write(folder / "vllm.log", "\n".join(lines[half:]) + "\n", end)
        if engine.role == "decode":
            _write_scrapes(deployment, engine, reads, folder, counts)
    return counts


def _write(path: Path, text: str, mtime: float) -> None:
    _write_bytes(path, text.encode(), mtime)


def _write_bytes(path: Path, data: bytes, mtime: float) -> None:
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))


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


def _log_lines(deployment: Deployment, engine, mine, reads, end: float, counts: dict) -> list[str]:
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
                f"Hybrid SSM registration: num_blocks=20000, logical_num_blocks=1000, ratio=20, num_regions=12, num_descs=480000, mamba_ssm_size=({model.conv_bytes_per_layer}, {model.ssm_bytes_per_layer}), block_len_per_layer={{{model.attention_page_bytes // 20 if model.attention_page_bytes else 0}}}",
                where="worker.py:781",
                process=proc,
            )
    if "config_mismatch" in options.inject and engine.role == "decode":
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
    if engine.role == "decode":
        ticks = _ticks(options.start_ts, end, options.stats_interval_s)
        done = sorted((x.done_ts, i, x) for i, x in enumerate(reads) if x.status == "ok")
        keys = [d for d, _, _ in done]
        previous = options.start_ts
        for tick in ticks:
            window = [
                x for _, _, x in done[bisect.bisect_right(keys, previous) : bisect.bisect_right(keys, tick)]
            ]
            recomputed = sum(r.recomputed_tokens for r in mine if previous < r.ts <= tick)
            running = sum(1 for r in mine if previous < r.ts <= tick)
            add(
                tick,
                f"Engine 000: Avg prompt throughput: {recomputed / options.stats_interval_s:.1f} tokens/s, Avg generation throughput: {running * 40 / options.stats_interval_s:.1f} tokens/s, Running: {running} reqs, Waiting: 0 reqs, GPU KV cache usage: 3.1%, Prefix cache hit rate: 0.0%",
                where="loggers.py:236",
                process=api,
            )
            if window:
                values = kv_metrics_values(window)
                add(
                    tick,
                    "KV Transfer metrics: " + ", ".join(f"{k}={v}" for k, v in values.items()),
                    where="metrics.py:103",
                    process=api,
                )
                counts["log_intervals"] += 1
            previous = tick
        for request in mine:
            for read in request.reads:
                if read.status == "failed":
                    context = {"failure_type": "transfer_failed", "request_id": read.request_id, "engine_id": read.engine_id,
                               "remote_engine_id": read.remote_engine_id, "remote_request_id": read.remote_request_id,
                               "remote_host": "10.0.12.7", "remote_port": 5600, "num_local_blocks": 12,
                               "num_remote_blocks": 12, "xfer_state": "ERR"}  # fmt: skip
                    add(
                        read.done_ts,
                        f"NIXL transfer failure: transfer_failed. Marking blocks as invalid | Context: {context!r}",
                        level="ERROR",
                        where="worker.py:505",
                        process=worker[read.rank] if len(worker) > read.rank else worker[0],
                    )
    else:
        for request in mine:
            if request.status == "expired":
                if options.era == "abort":
                    text = f"Releasing expired KV blocks for request {request.remote_request_id} which were retrieved by 0 decode worker(s) within 480 seconds."
                else:
                    text = f"Releasing expired KV blocks for request {request.remote_request_id} which were retrieved by 0 remote worker(s) before lease expired."
                add(request.ts + 30, text, level="WARNING", where="base_worker.py:2152", process=worker[0])
        for tick in _ticks(options.start_ts, end, options.stats_interval_s):
            tokens = sum(r.prompt_tokens for r in mine if tick - options.stats_interval_s < r.ts <= tick)
            add(
                tick,
                f"Engine 000: Avg prompt throughput: {tokens / options.stats_interval_s:.1f} tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.4%, Prefix cache hit rate: 0.0%",
                where="loggers.py:236",
                process=api,
            )
    for n, request in enumerate(mine):
        add(
            request.ts,
            f'10.0.0.{n % 200}:41234 - "POST /v1/completions HTTP/1.1" 200 OK',
            where="api_server.py:1019",
            process=api,
        )
    events.sort(key=lambda item: (item[0], item[1]))
    return [line for _, _, line in events]


def _histogram(name: str, bounds, values: list[float], labels: str) -> list[str]:
    ordered = sorted(values)
    lines = [f"# HELP {name} {name.split(':')[-1]}", f"# TYPE {name} histogram"]
    for bound in bounds:
        lines.append(
            f'{name}_bucket{{{labels},le="{float(bound)}"}} {float(bisect.bisect_right(ordered, bound))}'
        )
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(len(ordered))}')
    lines.append(f"{name}_count{{{labels}}} {float(len(ordered))}")
    lines.append(f"{name}_sum{{{labels}}} {float(sum(ordered))!r}")
    return lines


def _write_scrapes(deployment: Deployment, engine, reads: list[Read], folder: Path, counts: dict) -> None:
    options = deployment.options
    labels = f'engine="0",model_name="{deployment.model_name}"'
    ok = sorted((x.done_ts, i, x) for i, x in enumerate(reads) if x.status == "ok")
    failed = sorted(x.done_ts for x in reads if x.status == "failed")
    keys = [d for d, _, _ in ok]
    for tick in _ticks(
        options.start_ts, options.start_ts + options.duration_s + 5, options.scrape_interval_s
    ):
        seen = [x for _, _, x in ok[: bisect.bisect_right(keys, tick)]]
        lines = ["# vLLM /metrics"]
        lines += _histogram("vllm:nixl_xfer_time_seconds", XFER_BUCKETS, [x.xfer_s for x in seen], labels)
        lines += _histogram("vllm:nixl_post_time_seconds", POST_BUCKETS, [x.post_s for x in seen], labels)
        lines += _histogram(
            "vllm:nixl_bytes_transferred", BYTE_BUCKETS, [float(x.bytes) for x in seen], labels
        )
        lines += _histogram(
            "vllm:nixl_num_descriptors", DESC_BUCKETS, [float(x.descriptors) for x in seen], labels
        )
        lines.append("# TYPE vllm:nixl_num_failed_transfers counter")
        lines.append(
            f"vllm:nixl_num_failed_transfers_total{{{labels}}} {float(bisect.bisect_right(failed, tick))}"
        )
        stamp = datetime.fromtimestamp(tick, UTC).strftime("%Y%m%dT%H%M%SZ")
        _write(folder / f"metrics-{stamp}.prom", "\n".join(lines) + "\n", tick)
        counts["prom_scrapes"] += 1
