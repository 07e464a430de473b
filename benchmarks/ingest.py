"""Ingest throughput against plain baselines measured in the same run.

    python benchmarks/ingest.py [--mb 1000] [--dir /tmp/ht-bench]

Generates a connector trace (JSON lines) and vLLM server logs of about ``--mb`` MB each,
then times, each in its own process (so peak memory is its own; with --repeat N, the
fastest of N runs, each from an empty store; the trace's baseline and ingest run back to back
each time, and the median ratio of those pairs is printed too):

- trace baseline: DuckDB ``read_json`` → Parquet;
- trace: ``hybridtrace ingest`` of the trace;
- log baseline: polars reads the lines and runs one 11-group ``extract_groups`` → Parquet;
- logs: ``hybridtrace ingest`` of the logs;
- re-run: ``hybridtrace ingest`` over both, unchanged.

It prints MB/s, records/s, peak RSS, and every time as a ratio to its baseline. These
machines are noisy: compare ratios, not seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import polars as pl
from _measure import run_timed

LOG_REGEX = (
    r"^(?:\((?P<process>[A-Za-z][\w]*) pid=(?P<pid>\d+)\) )?(?P<level>[A-Z]+) (?P<month>\d\d)-(?P<day>\d\d) "
    r"(?P<hour>\d\d):(?P<minute>\d\d):(?P<second>\d\d) \[(?P<file>[^:\]]+):(?P<lineno>\d+)\] (?P<msg>.*)$"
)


def make_trace(path: Path, megabytes: int) -> int:
    """Transfer records, ~170 bytes each, written in vectorised blocks."""
    path.parent.mkdir(parents=True, exist_ok=True)
    per_block = 500_000
    written = records = 0
    with open(path, "wb") as handle:
        block = 0
        while written < megabytes * 1_000_000:
            n = per_block
            i = pl.int_range(block * n, (block + 1) * n, eager=True)
            frame = pl.DataFrame(
                {
                    "type": pl.repeat("transfer", n, eager=True),
                    "v": pl.repeat(1, n, eager=True),
                    "ts": 1764400000.0 + i.cast(pl.Float64) * 0.001,
                    "request_id": "cmpl-" + (i // 4).cast(pl.String),
                    "engine_id": pl.repeat("decode-0", n, eager=True),
                    "remote_engine_id": pl.repeat("prefill-0", n, eager=True),
                    "rank": (i % 4).cast(pl.Int32),
                    "tp_size": pl.repeat(4, n, eager=True),
                    "remote_rank": (i % 4).cast(pl.Int32),
                    "remote_tp_size": pl.repeat(4, n, eager=True),
                    "status": pl.repeat("ok", n, eager=True),
                    "post_s": 0.0004 + (i % 7).cast(pl.Float64) * 1e-5,
                    "xfer_s": 0.003 + (i % 13).cast(pl.Float64) * 1e-4,
                    "bytes": 9_000_000 + (i % 1000) * 3072,
                    "descriptors": 100 + (i % 50),
                    "staging_bytes": pl.repeat(0, n, eager=True),
                }
            )
            data = frame.write_ndjson().encode()
            handle.write(data)
            written += len(data)
            records += n
            block += 1
    return records


def make_logs(folder: Path, megabytes: int) -> int:
    """vLLM logs of a busy decode instance: mostly uninteresting INFO lines."""
    folder.mkdir(parents=True, exist_ok=True)
    common = [
        '(APIServer pid=1) INFO 04-21 10:{m:02d}:{s:02d} [api_server.py:1000] 10.0.0.{k}:5000 - "POST /v1/completions HTTP/1.1" 200 OK',
        "(APIServer pid=1) INFO 04-21 10:{m:02d}:{s:02d} [loggers.py:236] Engine 000: Avg prompt throughput: {k}.0 tokens/s, Avg generation throughput: 412.7 tokens/s, Running: 12 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.9%, Prefix cache hit rate: 0.0%",
        "(APIServer pid=1) INFO 04-21 10:{m:02d}:{s:02d} [metrics.py:103] KV Transfer metrics: Num successful transfers={k}, Avg xfer time (ms)=3.056, P90 xfer time (ms)=3.056, Avg post time (ms)=1.563, P90 post time (ms)=1.563, Avg MB per transfer=14.0, Throughput (MB/s)=4581.152, Avg number of descriptors=56.0",
        "(Worker_TP1 pid=306) DEBUG 04-21 10:{m:02d}:{s:02d} [worker.py:900] Rank 1, get_finished: 0 requests done sending and {k} requests done recving",
        "(EngineCore_DP0 pid=212) INFO 04-21 10:{m:02d}:{s:02d} [core.py:100] scheduled batch {k}",
        "(Worker_TP0 pid=305) WARNING 04-21 10:{m:02d}:{s:02d} [worker.py:1498] Releasing expired KV blocks for request cmpl-{k} which were retrieved by 0 decode worker(s) within 480 seconds.",
    ]
    weights = [40, 5, 5, 40, 9, 1]
    lines = []
    for index, (template, weight) in enumerate(zip(common, weights, strict=True)):
        for j in range(weight):
            lines.append(template.format(m=(j + index) % 60, s=j % 60, k=j))
    sample = ("\n".join(lines) + "\n").encode()
    total = 0
    count = 0
    files = max(1, megabytes // 250)
    for f in range(files):
        path = folder / f"instance-{f}" / "vllm.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(
                f"(Worker_TP0 pid=305) INFO 04-21 09:00:00 [worker.py:1] Initializing NIXL worker engine-{f}\n".encode()
            )
            target = megabytes * 1_000_000 // files
            written = 0
            block = sample * max(1, 8_000_000 // len(sample))
            while written < target:
                handle.write(block)
                written += len(block)
                count += block.count(b"\n")
        total += written
    return count


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=int, default=1000, help="size of each input, MB")
    parser.add_argument("--dir", default="/tmp/hybridtrace-bench")
    parser.add_argument("--repeat", type=int, default=1, help="timed runs of each step; the fastest counts")
    args = parser.parse_args()
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    trace = root / "trace" / "decode-0" / "trace.jsonl"
    t = time.perf_counter()
    trace_records = make_trace(trace, args.mb)
    log_lines = make_logs(root / "logs", args.mb)
    print(f"generated in {time.perf_counter() - t:.1f} s")
    trace_mb = trace.stat().st_size / 1e6
    log_mb = sum(p.stat().st_size for p in (root / "logs").rglob("vllm.log")) / 1e6

    results = {}

    def timed(code: str, before: Callable[[], None] | None = None) -> tuple[float, int, str]:
        """The fastest of ``--repeat`` runs (these machines are noisy), each from a clean start."""
        best = None
        for _ in range(args.repeat):
            if before is not None:
                before()
            run = run_timed(code)
            if best is None or run[0] < best[0]:
                best = run
        assert best is not None
        return best

    def fresh(store: str) -> Callable[[], None]:
        return lambda: shutil.rmtree(root / store, ignore_errors=True)

    # the trace's two back to back, each repeat: the ratio of a pair is taken within seconds
    # on a machine whose speed drifts by tens of percent over minutes
    trace_runs: dict[str, list[tuple[float, int, str]]] = {"trace baseline": [], "trace ingest": []}
    for _ in range(args.repeat):
        trace_runs["trace baseline"].append(run_timed(
            f"import duckdb; duckdb.sql(\"COPY (SELECT * FROM read_json('{trace}', format='newline_delimited')) "
            f"TO '{root}/baseline-trace.parquet' (FORMAT parquet)\")"
        ))  # fmt: skip
        fresh("store-trace")()
        trace_runs["trace ingest"].append(run_timed(
            f"from hybridtrace.ingest.run import ingest; ingest(['{root}/trace'], '{root}/store-trace')"
        ))  # fmt: skip
    for name, runs in trace_runs.items():
        results[name] = min(runs, key=lambda run: run[0])
    trace_pairs = [i[0] / b[0] for b, i in zip(trace_runs["trace baseline"], trace_runs["trace ingest"], strict=True)]
    log_files = [str(p) for p in sorted((root / "logs").rglob("vllm.log"))]
    results["log baseline"] = timed(
        "import polars as pl\n"
        f"files = {log_files!r}\n"
        "for n, f in enumerate(files):\n"
        "    lines = pl.read_csv(f, has_header=False, separator='\\x1f', quote_char=None, new_columns=['raw'],"
        " schema={'raw': pl.String})\n"
        f"    lines.select(pl.col('raw').str.extract_groups({LOG_REGEX!r})).unnest('raw')"
        f".write_parquet('{root}/baseline-log-' + str(n) + '.parquet')"
    )
    results["log ingest"] = timed(
        f"from hybridtrace.ingest.run import ingest; ingest(['{root}/logs'], '{root}/store-logs')",
        fresh("store-logs"),
    )
    results["re-run, unchanged"] = timed(
        f"from hybridtrace.ingest.run import ingest; ingest(['{root}/trace'], '{root}/store-trace');"
        f"ingest(['{root}/logs'], '{root}/store-logs')"
    )
    report = {
        "trace_mb": round(trace_mb, 1),
        "trace_records": trace_records,
        "log_mb": round(log_mb, 1),
        "log_lines": log_lines,
    }
    for name, (seconds, rss, _) in results.items():
        mb = trace_mb if name.startswith("trace") else log_mb if name.startswith("log") else trace_mb + log_mb
        records = trace_records if name.startswith("trace") else log_lines
        print(f"{name:20s} {seconds:7.2f} s  {mb / seconds:8.1f} MB/s  {records / seconds:12,.0f} rec/s  "
              f"peak RSS {rss / 2**20:7.1f} MiB")  # fmt: skip
    trace_ratio = results["trace ingest"][0] / results["trace baseline"][0]
    log_ratio = results["log ingest"][0] / results["log baseline"][0]
    rerun_ratio = results["re-run, unchanged"][0] / (results["trace ingest"][0] + results["log ingest"][0])
    print(f"trace ingest / DuckDB read_json baseline: {trace_ratio:.2f}x (target <= 2.0x, peak RSS < 1 GiB)")
    if len(trace_pairs) > 1:
        print(f"  the {len(trace_pairs)} back-to-back pairs: median {statistics.median(trace_pairs):.2f}x, "
              f"from {min(trace_pairs):.2f}x to {max(trace_pairs):.2f}x")
    print(f"log ingest / one-regex polars baseline:    {log_ratio:.2f}x (target <= 2x)")
    print(f"re-run / first run:                        {rerun_ratio * 100:.2f}% (target < 2%)")
    report.update(trace_ratio=trace_ratio, trace_pairs_median=statistics.median(trace_pairs), log_ratio=log_ratio,
                  rerun_pct=rerun_ratio * 100)
    print(json.dumps(report))
    os.makedirs(root, exist_ok=True)


if __name__ == "__main__":
    main()
