"""The progress bar of ``ingest --progress``."""

from __future__ import annotations

import sys
import time

from hybridtrace.ingest.summary import IngestSummary


class Progress:
    """A one-line bar on stderr, redrawn at most ten times a second; silent when off."""

    def __init__(self, enabled: bool, total_bytes: int) -> None:
        self.enabled = enabled
        self.total = max(total_bytes, 1)
        self.started = time.monotonic()
        self.drawn = 0.0

    def update(self, summary: IngestSummary, done_bytes: int, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self.drawn < 0.1):
            return
        self.drawn = now
        share = min(done_bytes / self.total, 1.0)
        bar = "#" * int(share * 30)
        rate = done_bytes / 1e6 / max(now - self.started, 1e-9)
        print(
            f"\r[{bar:<30}] {share * 100:5.1f}%  {done_bytes / 1e6:,.0f}/{self.total / 1e6:,.0f} MB  "
            f"{rate:,.0f} MB/s  {summary.objects_read} objects",
            end="",
            file=sys.stderr,
            flush=True,
        )

    def close(self) -> None:
        if self.enabled:
            print(file=sys.stderr)
