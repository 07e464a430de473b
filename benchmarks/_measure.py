"""Shared by the benchmarks: run code in a fresh interpreter, time it, and read its peak memory."""

from __future__ import annotations

import subprocess
import sys


def run_timed(code: str) -> tuple[float, int, str]:
    """Seconds, peak RSS (bytes) and the last line ``code`` printed, in a fresh interpreter.

    Peak memory comes from GNU time's report of the child alone: a child's own getrusage
    would carry over the high-water mark of the (generating) parent.
    """
    wrapper = f"import time\nt = time.perf_counter()\n{code}\nprint(time.perf_counter() - t)\n"
    out = subprocess.run(
        ["/usr/bin/time", "-f", "maxrss_kb=%M", sys.executable, "-c", wrapper],
        check=True,
        capture_output=True,
        text=True,
    )
    lines = out.stdout.strip().splitlines()
    rss_kb = int(out.stderr.strip().rsplit("maxrss_kb=", 1)[1].split()[0])
    return float(lines[-1]), rss_kb * 1024, lines[-2] if len(lines) > 1 else ""
