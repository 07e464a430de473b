"""Analysis time and memory against a plain DuckDB GROUP BY over the same Parquet.

    python benchmarks/analyze.py [--requests 1000000] [--dir /tmp/hybridtrace-analyze-bench] [--keep]

Simulates N requests at TP 4 (every kind injected at a few percent) and ingests the
bundle once; with --keep a store from an earlier run with the same N is reused. Then, each
in a fresh interpreter:
- the baseline: one DuckDB GROUP BY per request and rank over the store's transfers
  Parquet (sum of bytes, max transfer time), joined to nothing: the floor for reading
  those columns once. Its sums and maxima are summed again outside, so DuckDB computes
  them: counting the groups alone lets the optimizer drop every aggregate and read the
  three key columns only, a DISTINCT and not the GROUP BY this claims to be;
- ``hybridtrace analyze`` on the store (every rule, the summary and the input counts).
Prints both best times, their ratio and each peak RSS, and the median ratio of the
back-to-back pairs (one baseline, then one analysis, per repeat): on a shared machine whose
speed drifts, the best of each side can come from minutes apart.

With --incremental (issue 20's first figure) the store is built without the last requests
of the decode trace; those arrive afterwards as one new object (a trace part of their own),
once the store's analysis state exists. Timed, each in a fresh interpreter on the same store:
- start-up: open the store for analysis and run ``SELECT 1`` (what ``hybridtrace query
  "SELECT 1"`` does);
- a full analysis (every rule over everything, writing no state: the analysis as it was);
- ``analyze`` incremental after the new object was ingested (each repeat first removes the
  state batch the previous repeat committed, so each starts from the same state).
- ``analyze`` incremental once more right after one that committed its state: a run with
  nothing new, the scheduled job's most common run;
- ``analyze`` incremental once more with DuckDB's profiler on, its statements' binding and
  optimizing summed (``_planning.py``): what the run spends planning before it reads a row,
  which at a few new requests is most of it.
The first run, ``analyze --full`` writing the state of every batch so far (the job's first
run on a store), is timed too, against the full analysis.
With --days N the simulated requests spread over N days instead of the simulator's two
minutes: a store whose reads fall into as many slow-rank windows, and whose logs and scrapes
cover as long, as N days of a deployment's give (the simulator scrapes every 15 s and logs
engine stats every 10 s).
With --scrape-days N the store also holds N days of one decode engine's Prometheus scrapes
(every 15 s), and the new object comes with the next five minutes of them: the run computes
those scrapes' intervals and reads the others' from its state.
All of it on a copy of the store, so that --keep reuses one without state or new object.
Prints each one's time beyond start-up and the ratio of the incremental one to the full one
(target: at most 5%).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _measure import compile_package, run_timed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--dir", default="/tmp/hybridtrace-analyze-bench")
    parser.add_argument("--keep", action="store_true", help="reuse the store of an earlier run")
    parser.add_argument("--repeat", type=int, default=2, help="timed runs of each side; the best counts")
    parser.add_argument(
        "--incremental",
        action="store_true",
        help="time analyze after one new object against a full analysis (issue 20)",
    )
    parser.add_argument(
        "--days",
        type=float,
        default=0,
        help="spread the simulated requests over this many days (default: the simulator's two minutes)",
    )
    parser.add_argument(
        "--scrape-days",
        type=float,
        default=0,
        help="with --incremental: days of one decode engine's Prometheus scrapes (every 15 s) in the store",
    )
    parser.add_argument(
        "--new-requests",
        type=int,
        default=20,
        help="with --incremental: requests of the decode trace held back as the new object",
    )
    args = parser.parse_args()
    if args.incremental:
        incremental(args)
        return
    root = Path(args.dir)
    store = root / f"store-{args.requests}{_days_suffix(args.days)}"
    if not (args.keep and (store / "sources").exists()):
        bundle = root / "bundle"
        for stale in (store, bundle):  # the stores of other runs in the folder stay
            shutil.rmtree(stale, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
        setup = (
            "from hybridtrace.simulate import SimOptions, parse_inject, simulate\n"
            "from hybridtrace.ingest.run import ingest\n"
            f"simulate(SimOptions(requests={args.requests}, prefill_tp=(4,), decode_tp=(4,),"
            f"{_duration(args.days)} inject=parse_inject('all')), {str(bundle)!r})\n"
            f"ingest([{str(bundle)!r}], {str(store)!r}, progress=False)\n"
        )
        seconds, _, _ = run_timed(setup)
        print(f"setup (simulate + ingest)  {seconds:6.1f} s")
        shutil.rmtree(bundle)

    glob = str(store / "transfers" / "**" / "*.parquet")
    baseline_sql = (
        "SELECT count(*), sum(b), max(x) FROM (SELECT engine_id, request_id, rank, "
        "sum(transported_bytes) AS b, max(xfer_s) AS x "
        f"FROM read_parquet('{glob}', hive_partitioning = false) GROUP BY ALL)"
    )
    baseline_code = f"import duckdb\nprint(duckdb.sql({baseline_sql!r}).fetchall()[0][0])\n"
    analyze_code = (
        "import json\n"
        "from hybridtrace.analyze import analyze\n"
        "from hybridtrace.store import Store\n"
        f"result = analyze(Store({str(store)!r}).connect())\n"
        "print(json.dumps({'transfers': result.inputs['transfers'], 'findings': len(result)}))\n"
    )
    runs: dict[str, list[tuple[float, int, str]]] = {"baseline": [], "analyze": []}
    for _ in range(args.repeat):
        for name, code in (("baseline", baseline_code), ("analyze", analyze_code)):
            runs[name].append(run_timed(code))
    best = {name: min(got, key=lambda run: run[0]) for name, got in runs.items()}
    base_s, base_rss, groups = best["baseline"]
    analyze_s, analyze_rss, counts = best["analyze"]
    # each repeat runs the two back to back: the ratio of a pair is taken in the same few
    # seconds of a shared machine, whose speed drifts by tens of percent over minutes
    pairs = [a[0] / b[0] for b, a in zip(runs["baseline"], runs["analyze"], strict=True)]
    counted = json.loads(counts)
    print(f"store             {args.requests:,} requests, {counted['transfers']:,} reads, {groups} groups")
    print(f"GROUP BY baseline {base_s:6.2f} s  peak RSS {base_rss / 2**20:,.0f} MiB")
    print(
        f"analyze           {analyze_s:6.2f} s  peak RSS {analyze_rss / 2**20:,.0f} MiB"
        f"  ({counted['findings']:,} findings)"
    )
    print(f"analyze / baseline: {analyze_s / base_s:.2f}x (best of each)")
    print(f"the {len(pairs)} back-to-back pairs: median {statistics.median(pairs):.2f}x, "
          f"from {min(pairs):.2f}x to {max(pairs):.2f}x")


def _timed(code: str) -> tuple[float, str]:
    """Wall seconds of a fresh interpreter running ``code`` (start-up included), its last line."""
    compile_package()
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    lines = out.stdout.strip().splitlines()
    return time.perf_counter() - started, lines[-1] if lines else ""


def _held_back(trace: Path, requests: int) -> list[str]:
    """The lines of the trace's last ``requests`` requests (all their records), taken out of it."""
    lines = trace.read_text().splitlines(keepends=True)
    ids: list[str] = []
    for line in reversed(lines):
        rid = json.loads(line).get("request_id")
        if rid and rid not in ids:
            ids.append(rid)
        if len(ids) >= requests:
            break
    chosen = set(ids)
    kept, held = [], []
    for line in lines:
        (held if json.loads(line).get("request_id") in chosen else kept).append(line)
    trace.write_text("".join(kept))
    return held


def _days_suffix(days: float) -> str:
    return f"-{days:g}d" if days else ""


def _duration(days: float) -> str:
    """SimOptions' argument spreading the requests over ``days`` (none: its default span)."""
    return f" duration_s={days * 86_400!r}," if days else ""


def held_back_store(
    root: Path, requests: int, new_requests: int, keep: bool, days: float = 0
) -> tuple[Path, Path]:
    """A store of ``requests`` at TP 4 (over ``days``, else the simulator's span) without the
    last ``new_requests`` of the decode trace, and those as one new object (a trace part of
    their own); with ``keep``, those of an earlier run are reused. Returns (store, the new
    object's file)."""
    # named by the counts and the span: a kept store is one with the same requests held back
    suffix = f"{requests}-{new_requests}{_days_suffix(days)}"
    store = root / f"store-incremental-{suffix}"
    new_object = root / f"new-{suffix}" / "decode-0" / "trace.part-new.jsonl"
    if not (keep and (store / "sources").exists() and new_object.exists()):
        bundle = root / "bundle"
        for stale in (store, new_object.parent.parent, bundle):
            shutil.rmtree(stale, ignore_errors=True)
        setup = (
            "from hybridtrace.simulate import SimOptions, parse_inject, simulate\n"
            f"simulate(SimOptions(requests={requests}, prefill_tp=(4,), decode_tp=(4,),"
            f"{_duration(days)} inject=parse_inject('all')), {str(bundle)!r})\n"
        )
        seconds, _ = _timed(setup)
        held = _held_back(bundle / "decode-0" / "trace.jsonl", new_requests)
        new_object.parent.mkdir(parents=True)
        new_object.write_text("".join(held))
        seconds += _timed(f"from hybridtrace.ingest.run import ingest\n"
                          f"ingest([{str(bundle)!r}], {str(store)!r}, progress=False)\n")[0]  # fmt: skip
        print(f"setup (simulate + ingest)  {seconds:6.1f} s; {len(held):,} records held back")
        shutil.rmtree(bundle)
    return store, new_object


def incremental(args: argparse.Namespace) -> None:
    root = Path(args.dir)
    store, new_object = held_back_store(root, args.requests, args.new_requests, args.keep, args.days)
    # timed on a copy, so that a kept store stays without state and without the new object
    work = root / f"work-{args.requests}"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(store, work)
    store = work
    scraped = ""
    if args.scrape_days:
        # a month-long store holds a month of the engines' scrapes: an incremental run should
        # pay for the new object's few only
        samples = write_scrapes(root / "scrapes", args.scrape_days)
        _timed(f"from hybridtrace.ingest.run import ingest\n"
               f"ingest([{str(root / 'scrapes')!r}], {str(store)!r}, progress=False)\n")  # fmt: skip
        shutil.rmtree(root / "scrapes")
        scraped = f"; {args.scrape_days:g} days of one engine's scrapes ({samples:,} samples)"
        # the new object comes with the engine's next five minutes of scrapes, as a job's does
        after = round(args.scrape_days * 86_400 / 15)
        fresh = write_scrapes(root / "scrapes", _NEW_SCRAPES * 15 / 86_400, after=after)
        scraped += f", and the next {_NEW_SCRAPES} ({fresh:,} samples) with the new object"
    # the state of every batch so far, then the new object in a batch of its own
    opened = f"from hybridtrace.store.analysis import open_analysis\ncon = open_analysis({str(store)!r})\n"
    analyzed = "from hybridtrace.analyze import analyze\n" + opened
    first, _ = _timed(analyzed + "analyze(con, incremental=True, full=True)\n")
    print(f"analyze --full (writes the state)  {first:6.2f} s")
    new_inputs = [str(new_object.parent.parent)] + ([str(root / "scrapes")] if args.scrape_days else [])
    _timed(f"from hybridtrace.ingest.run import ingest\n"
           f"ingest({new_inputs!r}, {str(store)!r}, progress=False)\n")  # fmt: skip
    shutil.rmtree(root / "scrapes", ignore_errors=True)
    state = _state_files(store)
    codes = {
        "start-up": opened + "print(con.sql('SELECT 1').fetchall()[0][0])\n",
        "full analysis": analyzed + "print(len(analyze(con)))\n",
        "incremental": analyzed + "print(len(analyze(con, incremental=True)))\n",
    }
    best: dict[str, tuple[float, str]] = {}
    for _ in range(args.repeat):
        for name, code in codes.items():
            for path in _state_files(store) - state:  # the previous repeat's state batch
                path.unlink()
            run = _timed(code)
            if name not in best or run[0] < best[name][0]:
                best[name] = run
    # the scheduled job's most common run: nothing new since the last one (the state of an
    # incremental run over the new object committed first, each repeat)
    nothing: tuple[float, str] | None = None
    for _ in range(args.repeat):
        for path in _state_files(store) - state:
            path.unlink()
        _timed(codes["incremental"])
        run = _timed(codes["incremental"])
        if nothing is None or run[0] < nothing[0]:
            nothing = run
    # the incremental run once more, its statements' planning summed (_planning.py): what it
    # costs before any row is read, against the same budget
    for path in _state_files(store) - state:
        path.unlink()
    planned = (
        f"import sys\nsys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
        "from _planning import PlanningTally\n" + analyzed
        + "tally = PlanningTally(con)\nanalyze(tally, incremental=True)\ntally.close_profile()\n"
        "print(tally.statements, tally.binding_s, tally.optimizing_s, tally.planning_s)\n"
    )
    statements, binding, optimizing, planning = _timed(planned)[1].split()
    for path in _state_files(store) - state:
        path.unlink()
    start = best["start-up"][0]
    full_s, full_n = best["full analysis"]
    inc_s, inc_n = best["incremental"]
    assert full_n == inc_n, f"the incremental analysis found {inc_n} findings, the full one {full_n}"
    assert nothing is not None and nothing[1] == full_n, "a run with nothing new found other findings"
    span = f" over {args.days:g} days" if args.days else ""
    print(f"store             {args.requests:,} requests at TP 4{span}{scraped}; "
          f"new object: {args.new_requests} requests")
    print(f"start-up          {start:6.2f} s  (open the store, SELECT 1)")
    print(f"full analysis     {full_s:6.2f} s  {full_s - start:6.2f} s beyond start-up  ({full_n} findings)")
    print(f"incremental       {inc_s:6.2f} s  {inc_s - start:6.2f} s beyond start-up")
    print(f"nothing new       {nothing[0]:6.2f} s  {nothing[0] - start:6.2f} s beyond start-up")
    ratio = (inc_s - start) / (full_s - start)
    print(f"incremental / full, beyond start-up: {ratio:.1%} (target <= 5%)")
    # the job's first run on a store (and a run after other thresholds or an upgrade): the
    # full analysis and the state it writes for the runs after it
    print(f"analyze --full writing the state / full analysis: {(first - start) / (full_s - start):.2f}x "
          "(beyond start-up; one run)")
    print(f"nothing new / full, beyond start-up: {(nothing[0] - start) / (full_s - start):.1%}")
    print(f"incremental, DuckDB planning alone: {float(planning):.2f} s over {statements} statements "
          f"(binding {float(binding):.2f} s, optimizing {float(optimizing):.2f} s): "
          f"{float(planning) / (full_s - start):.1%} of the full analysis beyond start-up, "
          "before a row is read (one run, profiled)")


# One scrape of a decode engine's vLLM NIXL metrics: four histograms (buckets, count, sum) and
# two counters, as vLLM exposes them; the values grow with the scrape's number.
_HISTOGRAMS = {
    "vllm:nixl_xfer_time_seconds": (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0),
    "vllm:nixl_post_time_seconds": (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0),
    "vllm:nixl_bytes_transferred": tuple(float(2 ** (10 + i)) for i in range(1, 25, 2)),
    "vllm:nixl_num_descriptors": (10.0, 50.0, 100.0, 400.0, 1000.0, 4000.0, 20000.0),
}
_SCRAPE_LABELS = 'engine="0",model_name="bench"'
# The scrapes that come with the new object: five minutes of them.
_NEW_SCRAPES = 20


def write_scrapes(folder: Path, days: float, after: int = 0) -> int:
    """``days`` of scrapes every 15 s of one decode engine (the simulator's decode-0), a file
    per day of timestamped samples as a collector keeps them, from the scrape numbered
    ``after`` on; returns the samples written."""
    target = folder / "decode-0"
    target.mkdir(parents=True, exist_ok=True)
    start = 1_776_700_000.0  # before the simulated trace: the scrapes' counts need not match it
    scrapes = after + round(days * 86_400 / 15)
    per_day = 86_400 // 15
    samples = 0
    for day, first in enumerate(range(after, scrapes, per_day)):
        lines = []
        for n in range(first, min(first + per_day, scrapes)):
            stamp = f" {int((start + 15 * n) * 1000)}"
            transfers = 40 * n
            for name, bounds in _HISTOGRAMS.items():
                for i, bound in enumerate(bounds):
                    lines.append(f'{name}_bucket{{{_SCRAPE_LABELS},le="{bound}"}} '
                                 f"{float(transfers * (i + 1) // len(bounds))}{stamp}")  # fmt: skip
                lines.append(f'{name}_bucket{{{_SCRAPE_LABELS},le="+Inf"}} {float(transfers)}{stamp}')
                lines.append(f"{name}_count{{{_SCRAPE_LABELS}}} {float(transfers)}{stamp}")
                lines.append(f"{name}_sum{{{_SCRAPE_LABELS}}} {transfers * 0.01}{stamp}")
            lines.append(f"vllm:nixl_num_failed_transfers_total{{{_SCRAPE_LABELS}}} {float(n // 100)}{stamp}")
            lines.append(f"vllm:nixl_num_kv_expired_reqs_total{{{_SCRAPE_LABELS}}} {float(n // 200)}{stamp}")
        (target / f"metrics-{after}-day{day:03d}.prom").write_text("\n".join(lines) + "\n")
        samples += len(lines)
    return samples


def _state_files(store: Path) -> set[Path]:
    """Every file of the analysis state and every commit record: what a state batch adds."""
    found = {p for p in (store / "sources").glob("part-*.parquet")}
    for table in ("analysis_runs", "analysis_requests", "analysis_findings", "analysis_rank_windows",
                  "analysis_counts", "analysis_run_findings", "analysis_scrapes", "analysis_scrape_series"):
        found |= set((store / table).rglob("*.parquet"))
    return found


if __name__ == "__main__":
    main()
