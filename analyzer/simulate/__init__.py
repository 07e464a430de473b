"""The telemetry simulator: a P/D deployment's logs, traces and scrapes, with ground truth.

``simulate(options, out)`` writes a bundle laid out like a log bucket and ``truth.json``:
the findings injected on purpose and those that are simply true of the deployment (a
handoff slower than recomputing its prefix). Nothing but ``truth.json`` marks an
injection. Requests are generated and written a block at a time, so memory does not
grow with the size of the bundle.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import TypeVar

import polars as pl

from hybridtrace.errors import UsageError
from hybridtrace.simulate.scenario import INJECTABLE, SimOptions, parse_inject
from hybridtrace.simulate.workload import blocks, global_findings, prepare
from hybridtrace.simulate.writers import BundleWriter

_COMPACT = {"separators": (",", ":"), "sort_keys": True}
_T = TypeVar("_T")
_END = object()


def _ahead(items: Iterator[_T]) -> Iterator[_T]:
    """``items``, the next one made on a background thread while the caller works on this one.

    Making a block and writing the one before are mostly polars and the kernel, both of
    which release the GIL: overlapped, they keep both cores busy. Blocks are still made one
    after another, in order, so the bundle's bytes do not change.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="hybridtrace-generate") as pool:
        pending = pool.submit(next, items, _END)
        while True:
            item = pending.result()
            if item is _END:
                return
            pending = pool.submit(next, items, _END)
            yield item  # type: ignore[misc]


def simulate(options: SimOptions, out: str | Path, *, block_size: int = 100_000) -> dict:
    """Write the bundle and its truth under ``out``; returns the truth without its findings list."""
    started = time.monotonic()
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        # a bundle mixed with other files (or an earlier bundle) would be read as one
        raise UsageError(f"{out}: not an empty folder; the bundle goes into a new or empty one")
    plan = prepare(options)
    writer = BundleWriter(plan, out)
    injected: dict[str, int] = {}
    natural: dict[str, int] = {}
    # Findings are written as the blocks are made, one per line (readable, and no second
    # pass over millions of them), into a hidden file that becomes truth.json only once
    # whole: a run that is stopped in any way leaves a bundle plainly without its truth.
    partial = out / ".truth.json.partial"
    written = 0
    try:
        with open(partial, "wb") as handle:
            handle.write(b'{"findings":[\n')

            def record(findings: pl.DataFrame) -> None:
                nonlocal written
                if not findings.height:
                    return
                for kind, was_injected, count in findings.group_by(["kind", "injected"]).len().iter_rows():
                    bucket = injected if was_injected else natural
                    bucket[kind] = bucket.get(kind, 0) + count
                # every line ends with the separator; the last one's is taken back below
                writer.sink.lines(handle, findings["line"] + ",")
                written += findings.height

            global_rows = [(f["kind"], True, json.dumps(f, **_COMPACT)) for f in global_findings(plan)]
            record(
                pl.DataFrame(
                    global_rows,
                    schema={"kind": pl.String, "injected": pl.Boolean, "line": pl.String},
                    orient="row",
                )
            )
            previous = None
            for block in _ahead(blocks(plan, block_size)):
                if previous is not None:
                    # Reads start after their request arrives: nothing before this block's
                    # first arrival can change any more.
                    writer.consume(previous, float(block.requests["arrival"].min()))
                record(block.findings)
                previous = block
            if previous is not None:
                writer.consume(previous, math.inf)
            counts = writer.close()
            if written:
                handle.seek(-2, os.SEEK_END)  # the last finding's ",\n"
                handle.truncate()
                handle.write(b"\n")
            summary = {
                "injected": injected,
                "natural": natural,
                "scenario": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(options).items()},
            }
            handle.write(b"],\n\"inputs\":" + json.dumps(counts, **_COMPACT).encode())
            handle.write(b',\n"summary":' + json.dumps(summary, **_COMPACT).encode() + b"}\n")
        partial.replace(out / "truth.json")
    except BaseException:
        writer.abort()
        partial.unlink(missing_ok=True)
        raise
    return {"inputs": counts, "summary": summary, "seconds": time.monotonic() - started}


__all__ = ["INJECTABLE", "SimOptions", "parse_inject", "simulate"]
