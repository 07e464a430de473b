"""Simulator throughput against the time to write the same bytes, measured in the same run.

    python benchmarks/simulate.py [--requests 1000000] [--dir /tmp/hybridtrace-sim-bench]

Simulates N requests (all kinds injected), then measures two floors for producing that
many bytes, in the same run:

- write: a fresh process holds every file of the bundle in memory and writes it out, as
  any program producing those bytes must (the simulator's own writes are of this kind);
- copy: the bundle copied file by file and synced (the kernel copies in place).

It prints the times, the simulator's ratio to each, and the simulator's peak memory.
These machines are noisy, and page-cache writes most of all: compare ratios.
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
    writer = (
        "import sys, time\nfrom pathlib import Path\n"
        f"src, dst = Path({str(root / 'bundle')!r}), Path({str(root / 'written')!r})\n"
        "files = {p.relative_to(src): p.read_bytes() for p in sorted(src.rglob('*')) if p.is_file()}\n"
        "started = time.perf_counter()\n"
        "for rel, data in files.items():\n"
        "    (dst / rel).parent.mkdir(parents=True, exist_ok=True)\n"
        "    (dst / rel).write_bytes(data)\n"
        "print(time.perf_counter() - started)\n"
    )
    write_s = float(subprocess.run([sys.executable, "-c", writer], check=True, capture_output=True,
                                   text=True).stdout)  # fmt: skip
    shutil.rmtree(root / "written")
    subprocess.run(["sync"], check=False)
    started = time.perf_counter()
    shutil.copytree(root / "bundle", root / "copy")
    subprocess.run(["sync"], check=False)
    copy_s = time.perf_counter() - started
    print(f"bundle            {size / 1e6:,.0f} MB, {args.requests:,} requests")
    rate = size / 1e6 / simulate_s
    print(f"simulate          {simulate_s:6.2f} s  {rate:7.1f} MB/s  peak RSS {peak / 2**20:,.0f} MiB")
    print(f"write (baseline)  {write_s:6.2f} s  {size / 1e6 / write_s:7.1f} MB/s")
    print(f"copy (baseline)   {copy_s:6.2f} s  {size / 1e6 / copy_s:7.1f} MB/s")
    print(f"simulate / write: {simulate_s / write_s:.2f}x")
    print(f"simulate / copy:  {simulate_s / copy_s:.2f}x")


if __name__ == "__main__":
    main()
