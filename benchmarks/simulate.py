"""Simulator throughput against the time to write the same bytes, measured in the same run.

    python benchmarks/simulate.py [--requests 1000000] [--dir /tmp/hybridtrace-sim-bench]

Simulates N requests (all kinds injected), then copies the bundle it wrote (read +
write of every file: the floor for producing that many bytes) and prints both times,
their ratio, and the simulator's peak memory.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--dir", default="/tmp/hybridtrace-sim-bench")
    args = parser.parse_args()
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    bundle = str(root / "bundle")
    code = (
        "from hybridtrace.simulate import SimOptions, parse_inject, simulate\n"
        f"simulate(SimOptions(requests={args.requests}, inject=parse_inject('all')), {bundle!r})\n"
    )
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    simulate_s = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    size = sum(p.stat().st_size for p in (root / "bundle").rglob("*") if p.is_file())
    started = time.perf_counter()
    shutil.copytree(root / "bundle", root / "copy")
    subprocess.run(["sync"], check=False)
    copy_s = time.perf_counter() - started
    print(f"bundle            {size / 1e6:,.0f} MB, {args.requests:,} requests")
    rate = size / 1e6 / simulate_s
    print(f"simulate          {simulate_s:6.2f} s  {rate:7.1f} MB/s  peak RSS {peak / 2**20:,.0f} MiB")
    print(f"copy (baseline)   {copy_s:6.2f} s  {size / 1e6 / copy_s:7.1f} MB/s")
    print(f"simulate / copy:  {simulate_s / copy_s:.2f}x")


if __name__ == "__main__":
    main()
