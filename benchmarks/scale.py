"""Ingest and analysis on Spark against local ones of the same data, and what 1 TB a day would need.

    python benchmarks/scale.py [--requests 20000] [--engines 4] [--dir /tmp/ht-scale] [--only analyze]

Needs the spark extra (``pip install ".[spark]"``) and Java 17. Simulates one bundle
(``--engines`` prefill and as many decode engines, so there are many objects to hand out),
then ingests it into a fresh store three times, each in its own process:

- ``--engine local``;
- ``--engine spark`` on ``local[1]`` (one executor core);
- ``--engine spark`` on ``local[2]`` (two).

Then it analyses the local ingest's store (a full analysis that writes the incremental
state, as ``analyze --full`` does) the same three ways, each on its own copy of the store,
and prints each analysis' time as a ratio to the local one's; the three must find the same
findings (what each is about: kind, severity, engine, request, rank), or it stops. ``--only
ingest`` or ``--only analyze`` times one side (the analyses still need the local ingest).

Spark's start (JVM, session, the first Python workers) is timed apart from the work, since
a cluster pays it once per job, not per object. It prints each ingest's MB/s and its time
as a ratio to the local ingest's, then an estimate, from the per-core rate measured, of the
executor cores that 1 TB/day of such input needs. These machines are noisy and shared:
compare ratios, not seconds.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
from pathlib import Path

from _measure import run_timed

TB_PER_DAY_MB_S = 1e6 / 86400  # 1 TB a day, evenly spread, in MB/s
HEADROOM = 2.0  # peaks, retries and slower objects than these: plan for twice the mean


def _ingest_code(bundle: Path, store: Path, master: str | None) -> str:
    """Code that prints the ingest's own seconds (Spark's start is timed before it)."""
    lines = ["from hybridtrace.ingest.run import ingest"]
    reader = "None"
    if master is not None:
        lines += [
            "from hybridtrace.spark.ingest import SparkReader",
            "from hybridtrace.spark.session import open_session, spark_options",
            f"reader = SparkReader(session=open_session(spark_options(master={master!r})))",
            # the first job starts the Python workers and has them import the parsers: paid
            # once per worker, as a cluster pays it once per job, not per object
            "def warm(batches):",
            "    import hybridtrace.ingest.formats, hybridtrace.ingest.trace, hybridtrace.ingest.vllm_log",
            "    import hybridtrace.ingest.prometheus, hybridtrace.spark.tasks, duckdb, polars",
            "    yield from batches",
            "n = reader.session.sparkContext.defaultParallelism",
            "reader.session.range(0, n, 1, n).mapInArrow(warm, 'id long').collect()",
        ]
        reader = "reader"
    lines += [
        "t0 = time.perf_counter()",
        f"summary = ingest([{str(bundle)!r}], {str(store)!r}, read_objects={reader})",
        "assert summary.errors == 0, summary.error_messages",
        "print(time.perf_counter() - t0)",
    ]
    return "\n".join(lines)


def _analyze_code(store: Path, master: str | None) -> str:
    """Code that prints the analysis' own seconds (Spark's start and warm-up timed before it)."""
    lines = ["from hybridtrace.analyze import analyze"]
    lines += ["from hybridtrace.store.analysis import open_analysis"]
    scope = "None"
    if master is not None:
        lines += [
            "from hybridtrace.spark.analysis import SparkScope",
            "from hybridtrace.spark.session import open_session, spark_options",
            f"scope = SparkScope(session=open_session(spark_options(master={master!r})))",
            "def warm(batches):",
            "    import hybridtrace.spark.analysis, hybridtrace.queries_loader, duckdb",
            "    yield from batches",
            "n = scope.session.sparkContext.defaultParallelism",
            "scope.session.range(0, n, 1, n).mapInArrow(warm, 'id long').collect()",
        ]
        scope = "scope"
    lines += [
        "t0 = time.perf_counter()",
        f"result = analyze(open_analysis({str(store)!r}), incremental=True, full=True, scope={scope})",
        "seconds = time.perf_counter() - t0",
        # what each finding is about, digested: the three analyses must agree on it
        "import hashlib, json",
        "keys = ('kind', 'severity', 'engine_id', 'request_id', 'rank')",
        "named = sorted(json.dumps([f[k] for k in keys], default=str) for f in result.findings)",
        "print(seconds, len(result), hashlib.sha256('\\n'.join(named).encode()).hexdigest()[:16])",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--engines", type=int, default=4, help="prefill engines, and as many decode ones")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/ht-scale"))
    parser.add_argument("--only", choices=("ingest", "analyze"), help="time one side only (analyze: "
                        "the store is ingested locally, untimed against Spark)")  # fmt: skip
    args = parser.parse_args()
    if shutil.which("java") is None:
        sys.exit("scale.py needs Java 17 (and the spark extra)")
    from hybridtrace.simulate import SimOptions, simulate

    shutil.rmtree(args.dir, ignore_errors=True)
    bundle = args.dir / "bundle"
    options = SimOptions(seed=11, requests=args.requests, duration_s=max(60.0, args.requests / 50),
                         prefill_engines=args.engines, decode_engines=args.engines)  # fmt: skip
    simulate(options, bundle)
    files = [p for p in bundle.rglob("*") if p.is_file()]
    mb = sum(p.stat().st_size for p in files) / 1e6
    print(f"bundle: {len(files)} objects, {mb:.1f} MB")

    if args.only != "analyze":
        _ingests(args.dir, bundle, mb)
    else:  # the store the analyses copy, ingested locally (not timed)
        run_timed(_ingest_code(bundle, args.dir / "store-local", None))
    if args.only != "ingest":
        _analyses(args.dir)


ENGINES = (("local", None), ("spark local[1]", "local[1]"), ("spark local[2]", "local[2]"))


def _ingests(root: Path, bundle: Path, mb: float) -> None:
    results = {}
    for name, master in ENGINES:
        store = root / f"store-{name.replace(' ', '-').replace('[', '').replace(']', '')}"
        total, rss, line = run_timed(_ingest_code(bundle, store, master))
        seconds = float(line)
        results[name] = seconds
        start = f", Spark start {total - seconds:.1f} s" if master else ""
        print(f"{name:16} {seconds:7.2f} s  {mb / seconds:7.1f} MB/s  peak RSS {rss / 2**20:6.0f} MiB{start}")
    base = results["local"]
    for name, seconds in results.items():
        print(f"ratio {name:16} {seconds / base:5.2f}× the local ingest's time")
    per_core = mb / results["spark local[1]"]
    scaling = results["spark local[1]"] / results["spark local[2]"]
    cores = math.ceil(TB_PER_DAY_MB_S * HEADROOM / per_core)
    print(f"two cores ingest {scaling:.2f}× as fast as one (2.00 would be linear)")
    executors = math.ceil(cores / 4)
    print(
        f"estimate: 1 TB/day is {TB_PER_DAY_MB_S:.1f} MB/s; at {per_core:.1f} MB/s per executor core, with "
        f"{HEADROOM:.0f}× headroom, about {cores} executor cores ({executors} executor"
        f"{'s' if executors > 1 else ''} of 4 cores), plus one driver that lists, merges and commits"
    )
    # local[N] runs the driver and its executors on the same cores: the per-core rate above
    # counts the driver's serial merge and commit as executor time, so it is a lower bound
    print(
        f"the driver commits serially: the local ingest's {mb / base:.1f} MB/s (parse and commit on one "
        "core) bounds from below what one driver commits; past that, split the inputs over stores"
    )


def _analyses(root: Path) -> None:
    analyses, digests = {}, {}
    ingested = root / "store-local"
    for name, master in ENGINES:
        store = root / f"analyze-{name.replace(' ', '-').replace('[', '').replace(']', '')}"
        shutil.copytree(ingested, store)
        total, rss, line = run_timed(_analyze_code(store, master))
        seconds, findings, digests[name] = float(line.split()[0]), int(line.split()[1]), line.split()[2]
        analyses[name] = seconds
        start = f", Spark start {total - seconds:.1f} s" if master else ""
        memory = f"peak RSS {rss / 2**20:6.0f} MiB"
        print(f"analyze {name:16} {seconds:7.2f} s  {findings} findings  {memory}{start}")
    if len(set(digests.values())) != 1:
        sys.exit(f"the analyses found different findings: {digests}")
    for name, seconds in analyses.items():
        print(f"ratio analyze {name:16} {seconds / analyses['local']:5.2f}× the local analysis' time")
    print(f"two cores analyse {analyses['spark local[1]'] / analyses['spark local[2]']:.2f}× as fast as one")


if __name__ == "__main__":
    main()
