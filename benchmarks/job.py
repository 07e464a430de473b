"""The scheduled job's run after one new object, against a full report of the same store.

    python benchmarks/job.py [--requests 1000000] [--dir /tmp/hybridtrace-analyze-bench] [--keep]

The store is analyze.py --incremental's (the same --dir shares it): N requests at TP 4 less
the last requests of the decode trace, which arrive as one new object. On a copy of it, the
job (``hybridtrace run``: ingest, incremental analysis, HTML report) runs once over an empty
input folder, which writes the analysis state of every batch. Then, each in a fresh
interpreter:
- the job once the new object is in its input folder (ingest it, analyse what it touches,
  report): the run a schedule makes all month;
- ``hybridtrace report --html`` on the same store: the report over every read, the baseline.
Each repeat starts from the same state (the previous repeat's batches are removed). Prints
both times, their ratio and each peak RSS.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from _measure import run_timed
from analyze import held_back_store


def _files(store: Path) -> set[Path]:
    return {p for p in store.rglob("*") if p.is_file()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--new-requests", type=int, default=20)
    parser.add_argument("--dir", default="/tmp/hybridtrace-analyze-bench")
    parser.add_argument("--keep", action="store_true", help="reuse the store of an earlier run")
    parser.add_argument("--repeat", type=int, default=2, help="timed runs of each side; the best counts")
    args = parser.parse_args()
    root = Path(args.dir)
    kept, new_object = held_back_store(root, args.requests, args.new_requests, args.keep)
    work = root / f"job-{args.requests}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    store = work / "store"
    shutil.copytree(kept, store)
    inputs = work / "in"
    inputs.mkdir()
    job = work / "job.toml"
    job.write_text(
        f"[inputs]\npaths = [{json.dumps(str(inputs))}]\n[store]\npath = {json.dumps(str(store))}\n"
        f"[report]\nhtml = {json.dumps(str(work / 'job.html'))}\n"
    )
    run = (
        "from hybridtrace.job import load_job, run_job\n"
        f"code, summary = run_job(load_job({str(job)!r}))\n"
        "print(json.dumps(summary))\n"
    )
    first = run_timed("import json\n" + run)
    print(f"first job run (writes the state)  {first[0]:6.2f} s")
    (inputs / "decode-0").mkdir()
    shutil.copy(new_object, inputs / "decode-0" / new_object.name)
    before = _files(store)
    codes = {
        "job run": "import json\n" + run,
        "full report": (
            "from hybridtrace.report import write_report\n"
            f"write_report({str(store)!r}, {str(work / 'full.html')!r})\n"
            "print('ok')\n"
        ),
    }
    best: dict[str, tuple[float, int, str]] = {}
    for _ in range(args.repeat):
        for name, code in codes.items():
            for path in _files(store) - before:  # the previous repeat's batches
                path.unlink()
            timed = run_timed(code)
            if name not in best or timed[0] < best[name][0]:
                best[name] = timed
    job_s, job_rss, summary = best["job run"]
    full_s, full_rss, _ = best["full report"]
    read = json.loads(summary)["objects"]["read"]
    print(f"store             {args.requests:,} requests at TP 4; new object: {args.new_requests} requests")
    print(f"job run           {job_s:6.2f} s  peak RSS {job_rss / 2**20:,.0f} MiB  ({read} object read)")
    print(f"full report       {full_s:6.2f} s  peak RSS {full_rss / 2**20:,.0f} MiB")
    print(f"job run / full report: {job_s / full_s:.2f}x")


if __name__ == "__main__":
    main()
