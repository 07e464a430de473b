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
Prints both times, their ratio and each peak RSS.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from _measure import run_timed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--dir", default="/tmp/hybridtrace-analyze-bench")
    parser.add_argument("--keep", action="store_true", help="reuse the store of an earlier run")
    parser.add_argument("--repeat", type=int, default=2, help="timed runs of each side; the best counts")
    args = parser.parse_args()
    root = Path(args.dir)
    store = root / f"store-{args.requests}"
    if not (args.keep and (store / "sources").exists()):
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        bundle = root / "bundle"
        setup = (
            "from hybridtrace.simulate import SimOptions, parse_inject, simulate\n"
            "from hybridtrace.ingest.run import ingest\n"
            f"simulate(SimOptions(requests={args.requests}, prefill_tp=(4,), decode_tp=(4,),"
            f" inject=parse_inject('all')), {str(bundle)!r})\n"
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
    best: dict[str, tuple[float, int, str]] = {}
    for _ in range(args.repeat):
        for name, code in (("baseline", baseline_code), ("analyze", analyze_code)):
            run = run_timed(code)
            if name not in best or run[0] < best[name][0]:
                best[name] = run
    base_s, base_rss, groups = best["baseline"]
    analyze_s, analyze_rss, counts = best["analyze"]
    counted = json.loads(counts)
    print(f"store             {args.requests:,} requests, {counted['transfers']:,} reads, {groups} groups")
    print(f"GROUP BY baseline {base_s:6.2f} s  peak RSS {base_rss / 2**20:,.0f} MiB")
    print(f"analyze           {analyze_s:6.2f} s  peak RSS {analyze_rss / 2**20:,.0f} MiB"
          f"  ({counted['findings']:,} findings)")
    print(f"analyze / baseline: {analyze_s / base_s:.2f}x")


if __name__ == "__main__":
    main()
