"""Write a simulated deployment as a log bucket would hold it, a block of requests at a time.

Layout::

    models/<model>/config.json
    prefill-0/vllm.log.1.gz (the first half of the run, rotated), vllm.log, trace.jsonl
    decode-0/vllm.log.1.gz, vllm.log, trace.jsonl,
             metrics-<UTC stamp>.prom every scrape interval

Every line is in the exact shape vLLM or the connector prints it. Records are encoded
column-wise and appended as blocks arrive; periodic lines (the 10-second statistics, the
scrapes) are written once no later read can land in their interval — reads start after
their request arrives, so the next block's first arrival is a watermark. Files are written
in a fixed order with fixed content (gzip without a timestamp): a seed gives the same bytes.
"""

from __future__ import annotations

import contextlib
import gzip
import heapq
import json
import math
import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import BinaryIO

import polars as pl

from hybridtrace import trace_v1
from hybridtrace.simulate.workload import Block, Plan

LEVEL_COLOURS = {"DEBUG": "37", "INFO": "32", "WARNING": "33", "ERROR": "31", "CRITICAL": "35"}
XFER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
POST_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
BYTE_BUCKETS = tuple(2 ** (10 + i) for i in range(1, 25, 2))
DESC_BUCKETS = (10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000)
HISTOGRAMS = (
    ("vllm:nixl_xfer_time_seconds", XFER_BUCKETS, "xfer_s"),
    ("vllm:nixl_post_time_seconds", POST_BUCKETS, "post_s"),
    ("vllm:nixl_bytes_transferred", BYTE_BUCKETS, "bytes"),
    ("vllm:nixl_num_descriptors", DESC_BUCKETS, "descriptors"),
)


def _contract_fields(record_type: str) -> tuple[str, ...]:
    """The fields of a record type as the contract's v1 has them, in the definition's order:
    the simulated connector is a stock one, so it writes none of hybridtrace's extensions."""
    return tuple(f.name for f in trace_v1.record_type(record_type).fields if not f.extension)


def _text_fields(record_type: str) -> set[str]:
    return {f.name for f in trace_v1.record_type(record_type).fields if f.type == "string"}


_TRANSFER_FIELDS = _contract_fields("transfer")
_REQUEST_FIELDS = _contract_fields("request")
# The keys of a read's group entries, as the definition names them (written literally below).
_READ_GROUP_KEYS = ("group", "kind", "blocks", "bytes", "descriptors")
if not set(_READ_GROUP_KEYS) <= {g.name for g in trace_v1.GROUP_FIELDS}:
    raise RuntimeError("the simulator writes group keys trace v1 does not define")


def _json_record(record_type: str, fields: tuple[str, ...], strings: set[str]) -> list[pl.Expr]:
    """Pieces of one JSON object per row, formatted directly: ids and enums need no escaping."""
    pieces: list[pl.Expr] = []
    text = '{"type":"' + record_type + '","v":1'
    for name in fields:
        quote = '"' if name in strings else ""
        pieces.append(pl.lit(f'{text},"{name}":{quote}'))
        pieces.append(pl.col(name).cast(pl.String).fill_null("null") if name not in strings else pl.col(name))
        text = quote
    pieces.append(pl.lit(text))
    return pieces


def _transfer_json() -> pl.Expr:
    """One transfer record per row, newline included."""
    pieces = _json_record("transfer", tuple(f for f in _TRANSFER_FIELDS if f != "groups"), _text_fields("transfer"))
    groups = [
        pl.lit(',"groups":[{"group":0,"kind":"attention","blocks":'), pl.col("blocks").cast(pl.String),
        pl.lit(',"bytes":'), pl.col("attention").cast(pl.String),
        pl.lit(',"descriptors":'), (pl.col("descriptors") - pl.col("state_descs")).cast(pl.String),
        pl.lit('},{"group":1,"kind":"mamba","blocks":1,"bytes":'), pl.col("state").cast(pl.String),
        pl.lit(',"descriptors":'), pl.col("state_descs").cast(pl.String), pl.lit("}]}\n"),
    ]  # fmt: skip
    return pl.concat_str([*pieces, *groups])


def _request_json() -> pl.Expr:
    return pl.concat_str([*_json_record("request", _REQUEST_FIELDS, _text_fields("request")), pl.lit("}\n")])


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


def _stamp(ts: pl.Expr) -> pl.Expr:
    """The log stamp of epoch seconds ``ts``, as ``_line`` prints it (both round to the microsecond)."""
    return pl.from_epoch((ts * 1e6).round().cast(pl.Int64), time_unit="us").dt.strftime("%m-%d %H:%M:%S")


# Histogram sums are kept as integers in these units: times are made rounded to the
# nanosecond, bytes and descriptors are whole. An integer sum is exact in any order, so a
# parallel group_by gives the same total, and the same seed the same bytes, every run.
_UNITS = {"xfer_s": 10**9, "post_s": 10**9, "bytes": 1, "descriptors": 1}


def _whole(column: str) -> pl.Expr:
    return (pl.col(column) * _UNITS[column]).round().cast(pl.Int64)


def _bucket(values: pl.Series, bounds: tuple[float, ...]) -> pl.Series:
    """The index of each value's histogram bucket: the first bound it does not exceed."""
    return pl.Series([float(b) for b in bounds]).search_sorted(values.cast(pl.Float64), side="left")


def _tick(column: str, start: float, every: float) -> pl.Expr:
    """The index of the periodic tick at or after ``column`` (tick k is at start + k * every)."""
    return ((pl.col(column) - start) / every).ceil().cast(pl.Int64).clip(1)


def kv_metrics_line(
    n: int, xfer_sum: float, xfer_p90: float, post_sum: float, post_p90: float, total_bytes: int, descriptors: int
) -> str:
    """The `KV Transfer metrics` message of one interval, rounded as vLLM rounds it (its P90s
    are numpy's default, linear, percentiles)."""
    values = {
        "Num successful transfers": n,
        "Avg xfer time (ms)": round(xfer_sum / n * 1e3, 3),
        "P90 xfer time (ms)": round(xfer_p90 * 1e3, 3),
        "Avg post time (ms)": round(post_sum / n * 1e3, 3),
        "P90 post time (ms)": round(post_p90 * 1e3, 3),
        "Avg MB per transfer": round(total_bytes / 2**20 / n, 3),
        "Throughput (MB/s)": round(total_bytes / 2**20 / xfer_sum, 3),
        "Avg number of descriptors": round(descriptors / n, 1),
    }
    return "KV Transfer metrics: " + ", ".join(f"{k}={v}" for k, v in values.items())


def _interval_summaries(rows: pl.DataFrame) -> dict[int, tuple]:
    """kv_metrics_line's arguments per interval ``k``, from the interval's successful reads.

    Times are summed as whole nanoseconds (see ``_UNITS``), so a sum does not depend on how
    a parallel group_by split the rows between threads.
    """
    summary = rows.group_by("k").agg(
        pl.len(),
        _whole("xfer_s").sum(),
        pl.col("xfer_s").quantile(0.9, interpolation="linear").alias("xfer_p90"),
        _whole("post_s").sum(),
        pl.col("post_s").quantile(0.9, interpolation="linear").alias("post_p90"),
        pl.col("bytes").sum(),
        pl.col("descriptors").sum(),
    )
    return {
        k: (n, xfer / 1e9, xfer_p90, post / 1e9, post_p90, total, descriptors)
        for k, n, xfer, xfer_p90, post, post_p90, total, descriptors in summary.iter_rows()
    }


def _encoded(frame: pl.DataFrame, record: pl.Expr, order: int) -> pl.DataFrame:
    """(ts, order, line) per row. Lazily: the streaming engine builds the string column a
    morsel per thread, where an eager select builds it on one."""
    return frame.lazy().select(pl.col("ts"), pl.lit(order).alias("order"), record.alias("line")).collect()


class _Sink:
    """Writes on one background thread, in the order asked, while the next block is made.

    Copying a block into the page cache takes the kernel 1–2 CPU seconds per GB here, and
    neither it nor making the next block needs the other's core: the write (and the gzip of the
    rotated log, which runs with it) releases the GIL. One thread keeps every file's writes
    in order, so a seed still gives the same bytes; at most ``limit`` bytes wait, so memory
    stays bounded. A failed write is raised by the next call, or by ``close``.
    """

    def __init__(self, limit: int = 256 << 20) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hybridtrace-write")
        self._pending: deque[tuple[Future, int]] = deque()
        self._waiting = 0
        self._limit = limit

    def _submit(self, work: Callable[[], object], size: int) -> None:
        self._pending.append((self._pool.submit(work), size))
        self._waiting += size
        while self._waiting > self._limit and len(self._pending) > 1:
            self._finish_one()

    def lines(self, handle: BinaryIO, lines: pl.Series, *, terminated: bool = False) -> None:
        """Each line as is, newline-terminated (``terminated``: each ends with its newline).

        The column's bytes are the file's bytes. Polars' CSV writer with no quoting and no
        header writes them as they are, a chunk of rows at a time from a small buffer that
        stays in the CPU cache: gathering the whole column into one buffer first (as Arrow's
        offsets need) costs twice as much and a block's worth of fresh memory.
        """
        if not lines.len():
            return
        if lines.null_count():  # a record built from a null piece is null as a whole
            raise ValueError("a line to write is null: a field it is built from has no value")
        frame = lines.to_frame()
        write = partial(
            frame.write_csv,
            handle,
            include_header=False,
            quote_style="never",
            line_terminator="" if terminated else "\n",
        )
        self._submit(write, frame.estimated_size())

    def _finish_one(self) -> None:
        future, size = self._pending.popleft()
        self._waiting -= size
        future.result()

    def drain(self) -> None:
        """Wait until everything asked is written."""
        while self._pending:
            self._finish_one()

    def close(self) -> None:
        try:
            self.drain()
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)


class _EngineFiles:
    """One engine's folder: trace, rotated and live log, scrapes; and its periodic state."""

    def __init__(self, plan: Plan, engine, out: Path, sink: _Sink) -> None:
        self.plan, self.engine, self.options = plan, engine, plan.options
        self.sink = sink
        self.folder = out / engine.engine_id
        self.folder.mkdir(parents=True, exist_ok=True)
        self.trace = open(self.folder / "trace.jsonl", "wb")  # noqa: SIM115 - closed in close()
        self.trace.write((json.dumps(self._engine_record(), sort_keys=True) + "\n").encode())
        # gzip without a timestamp, so the same lines give the same bytes. Level 1: no reader
        # can tell the level, and logrotate's default 6 takes three times the CPU.
        self.rotated = gzip.GzipFile(self.folder / "vllm.log.1.gz", "wb", compresslevel=1, mtime=0)
        self.live = open(self.folder / "vllm.log", "wb")  # noqa: SIM115 - closed in close()
        self.rotate_at = self.options.start_ts + self.options.duration_s / 2
        self.pending: list[tuple[float, int, str]] = []  # log lines not yet written (a heap)
        self.bulk: list[pl.DataFrame] = []  # per-row log lines not yet written (ts, seq, line)
        self.seq = 0
        self.api, core = "APIServer pid=1", "EngineCore_DP0 pid=212"
        self.core = core
        tp = engine.tp_size
        self.workers = [f"Worker_TP{r} pid={300 + r}" for r in range(tp)] if tp > 1 else [core]
        self.stat_rows: list[pl.DataFrame] = []  # successful reads of open 10-second intervals
        self.load: dict[int, list[int]] = {}  # k -> [requests, tokens]
        self.next_tick = 1
        self.scrape_counts: dict[int, list[list[int]]] = {}  # open scrape ticks -> bucket counts
        self.scrape_sums: dict[int, list[int]] = {}  # in _UNITS
        self.scrape_failed: dict[int, int] = {}
        self.cumulative = [[0] * (len(bounds) + 1) for _, bounds, _ in HISTOGRAMS]
        self.cumulative_sums = [0] * len(HISTOGRAMS)  # in _UNITS
        self.failed_total = 0
        self.next_scrape = 1
        self.counts = {"transfers": 0, "requests": 0, "log_intervals": 0, "prom_scrapes": 0}
        self._startup()

    def _engine_record(self) -> dict:
        model = self.plan.byte_models[self.engine.engine_id]
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
            "ts": self.options.start_ts - 60,
            "engine_id": self.engine.engine_id,
            "role": self.engine.role,
            "model": self.plan.model_name,
            "tp_size": self.engine.tp_size,
            "kv_cache_dtype": model.kv_cache_dtype,
            "kv_buffer_device": "cuda",
            "mamba_cache_dtype": model.mamba_cache_dtype,
            "mamba_ssm_cache_dtype": model.mamba_ssm_cache_dtype,
            "hybrid_allocator": True,
            "groups": groups,
        }

    def add(self, ts: float, message: str, **kw) -> None:
        heapq.heappush(self.pending, (ts, self.seq, _line(ts, message, colour=self.options.colour, **kw)))
        self.seq += 1

    def _startup(self) -> None:
        model = self.plan.byte_models[self.engine.engine_id]
        start, api, core = self.options.start_ts - 60, self.api, self.core
        if model.block_tokens and model.mamba_padding_pct is not None:
            self.add(
                start,
                f"Setting attention block size to {model.block_tokens} tokens to ensure that attention page size is >= mamba page size.",
                where="interface.py:911",
                process=api,
            )
            self.add(
                start,
                f"Padding mamba page size by {model.mamba_padding_pct:.2f}% to ensure that mamba page size and attention page size are exactly equal.",
                where="interface.py:935",
                process=api,
            )
        self.add(
            start + 5,
            f"Initializing NIXL worker {self.engine.engine_id}",
            where="worker.py:210",
            process=self.workers[0],
        )
        groups = model.kv_cache_groups
        if groups and groups.padding_layers:
            self.add(
                start + 8,
                f"Add {groups.padding_layers} padding layers, may waste at most {groups.padding_pct:.2f}% KV cache memory",
                level="WARNING",
                where="kv_cache_utils.py:1152",
                process=core,
            )
        self.add(
            start + 9,
            "GPU KV cache size: 1,234,512 tokens, Maximum concurrency for 131,072 tokens per request: 9.42x",
            where="kv_cache_utils.py:1882",
            process=core,
        )
        for proc in self.workers:
            self.add(
                start + 10,
                "Registering KV_Caches. use_mla: False, kv_buffer_device: cuda, use_host_buffer: False",
                where="worker.py:640",
                process=proc,
            )
            if model.conv_bytes_per_layer is not None:
                self.add(
                    start + 10,
                    f"Hybrid SSM registration: num_blocks=20000, logical_num_blocks=1000, ratio=20, num_regions=12, num_descs=480000, mamba_ssm_size=({model.conv_bytes_per_layer}, {model.ssm_bytes_per_layer}), block_len_per_layer={{{(model.attention_page_bytes or 0) // 20}}}",
                    where="worker.py:781",
                    process=proc,
                )
        if "config_mismatch" in self.options.inject and self.engine.engine_id == "decode-0":
            self.add(
                start + 20,
                'Traceback (most recent call last):\n  File "worker.py", line 434, in _nixl_handshake\nRuntimeError: NIXL compatibility hash mismatch. Local: 7a1c0e, Remote: 93bd42',
                level="ERROR",
                where="worker.py:434",
                process=self.workers[0],
            )
        else:
            self.add(
                start + 20,
                "NIXL compatibility check passed (hash: 7a1c0e5b)",
                where="worker.py:434",
                process=self.workers[-1],
            )

    # --- one block ----------------------------------------------------------------------

    def consume(self, requests: pl.DataFrame, reads: pl.DataFrame) -> None:
        options = self.options
        interval = options.stats_interval_s
        if self.engine.role == "decode":
            self._trace(requests, reads)
            self._stats(reads)
            for k, n, tokens in (
                requests.with_columns(_tick("ts", options.start_ts, interval).alias("k"))
                .group_by("k", maintain_order=True)
                .agg(pl.len(), pl.col("recomputed_tokens").sum())
                .iter_rows()
            ):
                slot = self.load.setdefault(k, [0, 0])
                slot[0] += n
                slot[1] += tokens
            failed = reads.filter(pl.col("status") == "failed")
            # the repr of the context dict vLLM logs (the ids need no escaping)
            context = pl.concat_str(
                pl.lit("{'failure_type': 'transfer_failed', 'request_id': '"), "request_id",
                pl.lit("', 'engine_id': '"), "engine_id",
                pl.lit("', 'remote_engine_id': '"), "remote_engine_id",
                pl.lit("', 'remote_request_id': '"), "remote_request_id",
                pl.lit("', 'remote_host': '10.0.12.7', 'remote_port': 5600, 'num_local_blocks': 12, "
                       "'num_remote_blocks': 12, 'xfer_state': 'ERR'}"),
            )  # fmt: skip
            self._log_lines(
                failed,
                pl.col("done_ts"),
                "NIXL transfer failure: transfer_failed. Marking blocks as invalid | Context: " + context,
                level="ERROR",
                where="worker.py:505",
                process=self._worker_of(pl.col("rank")),
            )
        else:
            if options.era == "abort":
                tail = " which were retrieved by 0 decode worker(s) within 480 seconds."
            else:
                tail = " which were retrieved by 0 remote worker(s) before lease expired."
            self._log_lines(
                requests.filter(pl.col("status") == "expired"),
                pl.col("ts") + 30,
                pl.concat_str(pl.lit("Releasing expired KV blocks for request "), "remote_request_id", pl.lit(tail)),
                level="WARNING",
                where="base_worker.py:2152",
                process=pl.lit(self.workers[0]),
            )
            for k, tokens in (
                requests.with_columns(_tick("ts", options.start_ts, interval).alias("k"))
                .group_by("k", maintain_order=True)
                .agg(pl.col("prompt_tokens").sum())
                .iter_rows()
            ):
                self.load.setdefault(k, [0, 0])[1] += tokens
        self._access_lines(requests)

    def _trace(self, requests: pl.DataFrame, reads: pl.DataFrame) -> None:
        transfers = _encoded(reads, _transfer_json(), 0)
        asked = _encoded(requests, _request_json(), 1)
        # Both record types stamp ts to the microsecond, so one integer key orders them as
        # (ts, order) would, and sorts faster than the two columns.
        merged = pl.concat([transfers, asked]).sort(
            (pl.col("ts") * 1e6).round().cast(pl.Int64) * 2 + pl.col("order"), maintain_order=True
        )
        self.sink.lines(self.trace, merged["line"], terminated=True)
        self.counts["transfers"] += reads.height
        self.counts["requests"] += requests.height

    def _stats(self, reads: pl.DataFrame) -> None:
        options = self.options
        reads = reads.select("done_ts", "xfer_s", "post_s", "bytes", "descriptors", "status")
        ok = reads.filter(pl.col("status") == "ok")
        if ok.height:
            ticks = _tick("done_ts", options.start_ts, options.stats_interval_s).alias("k")
            self.stat_rows.append(ok.select(ticks, "xfer_s", "post_s", "bytes", "descriptors"))
            scrape = ok.select(
                _tick("done_ts", options.start_ts, options.scrape_interval_s).alias("k"),
                *[_whole(column).alias(f"v{h}") for h, (_, _, column) in enumerate(HISTOGRAMS)],
            ).with_columns(
                _bucket(ok[column], bounds).alias(f"b{h}") for h, (_, bounds, column) in enumerate(HISTOGRAMS)
            )
            totals = scrape.group_by("k").agg(pl.col(f"v{h}").sum() for h in range(len(HISTOGRAMS)))
            for k, *values in totals.iter_rows():
                sums = self.scrape_sums.setdefault(k, [0] * len(HISTOGRAMS))
                for h, value in enumerate(values):
                    sums[h] += value
            for h in range(len(HISTOGRAMS)):
                for k, b, count in scrape.group_by("k", f"b{h}").len().iter_rows():
                    counts = self.scrape_counts.setdefault(k, [[0] * (len(bs) + 1) for _, bs, _ in HISTOGRAMS])
                    counts[h][b] += count
        failed = reads.filter(pl.col("status") == "failed").select(
            _tick("done_ts", options.start_ts, options.scrape_interval_s).alias("k")
        )
        for k, n in failed.group_by("k").len().iter_rows():
            self.scrape_failed[k] = self.scrape_failed.get(k, 0) + n

    def _access_lines(self, requests: pl.DataFrame) -> None:
        # one access-log line per request: the bulk of a real log, of no interest to hybridtrace
        self._log_lines(
            requests,
            pl.col("ts"),
            pl.format('10.0.0.{}:41234 - "POST /v1/completions HTTP/1.1" 200 OK', pl.col("n") % 200),
            level="INFO",
            where="api_server.py:1019",
            process=pl.lit(self.api),
        )

    def _worker_of(self, rank: pl.Expr) -> pl.Expr:
        """The process name of the worker that serves ``rank`` (the engine core's without TP)."""
        return pl.lit(pl.Series(self.workers)).gather(rank.clip(upper_bound=len(self.workers) - 1))

    def _log_lines(
        self, rows: pl.DataFrame, ts: pl.Expr, message: pl.Expr | str, *, level: str, where: str, process: pl.Expr
    ) -> None:
        """One single-line log message per row of ``rows``, queued as ``add`` queues one, in row order."""
        if not rows.height:
            return
        # the head with placeholders for the process and the stamp, which vary by row
        before, between, after = _head(level, "\x01", where, "\x00", self.options.colour).replace(
            "\x01", "\x00"
        ).split("\x00")
        lines = rows.select(
            ts.alias("ts"),
            pl.int_range(self.seq, self.seq + pl.len(), dtype=pl.Int64).alias("seq"),
            pl.concat_str(
                pl.lit(before), process, pl.lit(between), _stamp(ts), pl.lit(after), message
            ).alias("line"),
        )
        self.seq += lines.height
        self.bulk.append(lines)

    # --- what is final --------------------------------------------------------------------

    def flush(self, watermark: float) -> None:
        """Write everything no later block can change: lines and intervals before ``watermark``."""
        options = self.options
        interval = options.stats_interval_s
        last_tick = math.ceil((options.start_ts + options.duration_s + 5.0 - options.start_ts) / interval)
        summaries = self._closed_intervals(watermark)
        while self.next_tick <= last_tick and options.start_ts + self.next_tick * interval < watermark:
            k, tick = self.next_tick, options.start_ts + self.next_tick * interval
            running, tokens = self.load.pop(k, [0, 0])
            if self.engine.role == "decode":
                self.add(
                    tick,
                    f"Engine 000: Avg prompt throughput: {tokens / interval:.1f} tokens/s, Avg generation throughput: {running * 40 / interval:.1f} tokens/s, Running: {running} reqs, Waiting: 0 reqs, GPU KV cache usage: 3.1%, Prefix cache hit rate: 0.0%",
                    where="loggers.py:236",
                    process=self.api,
                )
                summary = summaries.get(k)
                if summary:
                    self.add(
                        tick,
                        kv_metrics_line(*summary),
                        where="metrics.py:103",
                        process=self.api,
                    )
                    self.counts["log_intervals"] += 1
            else:
                self.add(
                    tick,
                    f"Engine 000: Avg prompt throughput: {tokens / interval:.1f} tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.4%, Prefix cache hit rate: 0.0%",
                    where="loggers.py:236",
                    process=self.api,
                )
            self.next_tick += 1
        ready = []
        while self.pending and self.pending[0][0] < watermark:
            ready.append(heapq.heappop(self.pending))
        frames = [
            pl.DataFrame(ready, schema={"ts": pl.Float64, "seq": pl.Int64, "line": pl.String}, orient="row")
        ]
        if self.bulk:
            bulk = pl.concat(self.bulk)
            frames.append(bulk.filter(pl.col("ts") < watermark))
            rest = bulk.filter(pl.col("ts") >= watermark)
            self.bulk = [rest] if rest.height else []
        merged = pl.concat(frames).sort(["ts", "seq"])
        early = merged.filter(pl.col("ts") < self.rotate_at)["line"]
        late = merged.filter(pl.col("ts") >= self.rotate_at)["line"]
        if early.len():
            self.sink.lines(self.rotated, early)
        if late.len():
            self.sink.lines(self.live, late)
        if self.engine.role == "decode":
            self._flush_scrapes(watermark)

    def _closed_intervals(self, watermark: float) -> dict[int, tuple]:
        """Summaries of the statistics intervals that end before ``watermark``; the reads of
        later intervals stay for the next flush."""
        if not self.stat_rows:
            return {}
        rows = pl.concat(self.stat_rows) if len(self.stat_rows) > 1 else self.stat_rows[0]
        options = self.options
        # the same arithmetic as the tick loop of flush, so both agree on every boundary
        closed = pl.lit(options.start_ts) + pl.col("k") * options.stats_interval_s < watermark
        done, rest = rows.filter(closed), rows.filter(~closed)
        self.stat_rows = [rest] if rest.height else []
        return _interval_summaries(done) if done.height else {}

    def _flush_scrapes(self, watermark: float) -> None:
        options = self.options
        every = options.scrape_interval_s
        last = int((options.duration_s + 5) // every)
        labels = f'engine="0",model_name="{self.plan.model_name}"'
        while self.next_scrape <= last and options.start_ts + self.next_scrape * every < watermark:
            k, tick = self.next_scrape, options.start_ts + self.next_scrape * every
            counts = self.scrape_counts.pop(k, None)
            sums = self.scrape_sums.pop(k, None)
            lines = ["# vLLM /metrics"]
            for h, (name, bounds, column) in enumerate(HISTOGRAMS):
                if counts:
                    for b in range(len(bounds) + 1):
                        self.cumulative[h][b] += counts[h][b]
                    self.cumulative_sums[h] += sums[h]
                lines += [f"# HELP {name} {name.split(':')[-1]}", f"# TYPE {name} histogram"]
                running = 0
                for b, bound in enumerate(bounds):
                    running += self.cumulative[h][b]
                    lines.append(f'{name}_bucket{{{labels},le="{float(bound)}"}} {float(running)}')
                total = running + self.cumulative[h][len(bounds)]
                lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(total)}')
                lines.append(f"{name}_count{{{labels}}} {float(total)}")
                lines.append(f"{name}_sum{{{labels}}} {self.cumulative_sums[h] / _UNITS[column]!r}")
            self.failed_total += self.scrape_failed.pop(k, 0)
            lines.append("# TYPE vllm:nixl_num_failed_transfers counter")
            lines.append(f"vllm:nixl_num_failed_transfers_total{{{labels}}} {float(self.failed_total)}")
            path = (
                self.folder / f"metrics-{datetime.fromtimestamp(tick, UTC).strftime('%Y%m%dT%H%M%SZ')}.prom"
            )
            path.write_bytes(("\n".join(lines) + "\n").encode())
            os.utime(path, (tick, tick))
            self.counts["prom_scrapes"] += 1
            self.next_scrape += 1

    def close(self) -> None:
        self.flush(math.inf)
        end = self.options.start_ts + self.options.duration_s + 5.0
        self.sink.drain()  # the files' last blocks are in before they close
        for handle in (self.trace, self.rotated, self.live):
            handle.close()
        os.utime(self.folder / "trace.jsonl", (end, end))
        os.utime(self.folder / "vllm.log", (end, end))
        os.utime(self.folder / "vllm.log.1.gz", (self.rotate_at, self.rotate_at))


def _rows_of(frame: pl.DataFrame, key: str, engine_id: str) -> pl.DataFrame:
    """The rows of ``frame`` whose ``key`` is ``engine_id``: the frame itself when all are
    (one engine per role, the usual case), which spares copying every column."""
    if not frame.height:
        return frame
    mine = frame[key] == engine_id
    return frame if mine.all() else frame.filter(mine)


class BundleWriter:
    """Writes a bundle block by block; ``close`` returns the counts the truth records."""

    def __init__(self, plan: Plan, out: Path) -> None:
        self.plan = plan
        out.mkdir(parents=True, exist_ok=True)
        end = plan.options.start_ts + plan.options.duration_s + 5.0
        # The config sits in a folder named as the engines name their model.
        config_dir = out / "models" / plan.model_name.rsplit("/", 1)[-1]
        config_dir.mkdir(parents=True, exist_ok=True)
        (config_dir / "config.json").write_text(json.dumps(plan.config, indent=2) + "\n")
        os.utime(config_dir / "config.json", (end, end))
        self.sink = _Sink()
        self.files = [_EngineFiles(plan, engine, out, self.sink) for engine in plan.engines]

    def consume(self, block: Block, watermark: float) -> None:
        for files in self.files:
            decode = files.engine.role == "decode"
            key = "engine_id" if decode else "remote_engine_id"
            requests = _rows_of(block.requests, key, files.engine.engine_id)
            # a prefill engine's files say nothing of the reads made from it
            reads = _rows_of(block.reads, key, files.engine.engine_id) if decode else block.reads.clear()
            if requests.height:
                files.consume(requests, reads)
            files.flush(watermark)

    def close(self) -> dict:
        counts = {
            "transfers": 0,
            "requests": 0,
            "engines": len(self.files),
            "log_intervals": 0,
            "prom_scrapes": 0,
        }
        try:
            for files in self.files:
                files.close()
                for key, value in files.counts.items():
                    counts[key] += value
        finally:
            self.sink.close()
        return counts

    def abort(self) -> None:
        """Stop writing after an error: nothing more is asked of the writing thread, and the
        files are closed as they are (a closed gzip part ends cleanly, however short)."""
        self.sink._pool.shutdown(wait=True, cancel_futures=True)
        for files in self.files:
            for handle in (files.trace, files.rotated, files.live):
                # the error being raised already says what went wrong
                with contextlib.suppress(OSError):
                    handle.close()


__all__ = ["BundleWriter", "kv_metrics_line"]
