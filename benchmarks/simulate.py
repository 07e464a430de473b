"""Simulator throughput against the time to write the same bytes, measured in the same run.

    python benchmarks/simulate.py [--requests 1000000] [--rounds 3] [--dir /tmp/hybridtrace-sim-bench]

Runs ``hybridtrace simulate`` (all kinds injected) as a user would, and, in alternation
with it, two floors for producing that many bytes:

- write: a fresh process holds every file of the bundle in memory and writes it out, as
  any program producing those bytes must (the simulator's own writes are of this kind);
- copy: the bundle copied file by file and synced (the kernel copies in place).

Every round deletes what it wrote before the next starts, so each contender finds the page
cache in the same state: on a virtual machine, writing into pages the guest has not used
yet costs several times more than reusing freed ones, and a benchmark that let one side
inherit the other's freed pages would measure that, not the program. The first simulation
only makes the bundle the floors write. Prints each round, the medians, their ratios, and
the simulator's peak memory. These machines are noisy: compare ratios.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _measure import compile_package

_WRITER = """
import sys, time
from pathlib import Path
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
files = {p.relative_to(src): p.read_bytes() for p in sorted(src.rglob('*')) if p.is_file()}
started, cpu = time.perf_counter(), time.process_time()
for rel, data in files.items():
    (dst / rel).parent.mkdir(parents=True, exist_ok=True)
    (dst / rel).write_bytes(data)
print(time.perf_counter() - started, time.process_time() - cpu)
"""


def _simulate(requests: int, out: Path) -> tuple[float, float, int]:
    """Seconds, CPU seconds and peak RSS (bytes) of ``hybridtrace simulate``, in its own process."""
    command = [
        "/usr/bin/time", "-f", "cpu_s=%U+%S maxrss_kb=%M", sys.executable, "-m", "hybridtrace", "simulate",
        "--out", str(out), "--requests", str(requests), "--inject", "all",
    ]  # fmt: skip
    compile_package()
    started = time.perf_counter()
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    report = done.stderr.rsplit("cpu_s=", 1)[1].split()
    user, system = report[0].split("+")
    return seconds, float(user) + float(system), int(report[1].removeprefix("maxrss_kb=")) * 1024


def _write(src: Path, dst: Path) -> tuple[float, float]:
    done = subprocess.run(
        [sys.executable, "-c", _WRITER, str(src), str(dst)], check=True, capture_output=True, text=True
    )
    seconds, cpu = done.stdout.split()
    return float(seconds), float(cpu)


def _copy(src: Path, dst: Path) -> float:
    subprocess.run(["sync"], check=False)
    started = time.perf_counter()
    shutil.copytree(src, dst)
    subprocess.run(["sync"], check=False)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/hybridtrace-sim-bench")
    args = parser.parse_args()
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    bundle, scratch = root / "bundle", root / "scratch"
    _simulate(args.requests, bundle)
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    print(f"bundle {size / 1e6:,.0f} MB, {args.requests:,} requests, {args.rounds} rounds")
    times: dict[str, list[float]] = {"simulate": [], "write": [], "copy": []}
    cpu: dict[str, list[float]] = {"simulate": [], "write": []}
    peaks = []
    for round_ in range(1, args.rounds + 1):
        for name in times:
            if name == "simulate":
                seconds, used, peak = _simulate(args.requests, scratch)
                cpu[name].append(used)
                peaks.append(peak)
            elif name == "write":
                seconds, used = _write(bundle, scratch)
                cpu[name].append(used)
            else:
                seconds = _copy(bundle, scratch)
            shutil.rmtree(scratch)
            times[name].append(seconds)
        print(f"round {round_}: " + "  ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()))
    median = {k: statistics.median(v) for k, v in times.items()}
    for name, seconds in median.items():
        used = f"  CPU {statistics.median(cpu[name]):5.2f} s" if name in cpu else ""
        print(f"{name:9s} median {seconds:6.2f} s  {size / 1e6 / seconds:7.1f} MB/s{used}")
    print(f"simulate peak RSS {max(peaks) / 2**20:,.0f} MiB")
    print(f"simulate / write: {median['simulate'] / median['write']:.2f}x")
    print(f"simulate / copy:  {median['simulate'] / median['copy']:.2f}x")
    # CPU seconds are steadier than wall time on a shared machine; the simulator uses both cores
    cpu_ratio = statistics.median(cpu["simulate"]) / statistics.median(cpu["write"])
    print(f"CPU, simulate / write: {cpu_ratio:.2f}x")
    shutil.rmtree(root)


if __name__ == "__main__":
    main()
