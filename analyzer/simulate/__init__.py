"""The telemetry simulator: a P/D deployment's logs, traces and scrapes, with ground truth.

``simulate(options, out)`` writes a bundle laid out like a log bucket and ``truth.json``:
the findings injected on purpose and those that are simply true of the deployment (a
handoff slower than recomputing its prefix). Nothing but ``truth.json`` marks an
injection.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from hybridtrace.simulate.scenario import INJECTABLE, SimOptions, parse_inject
from hybridtrace.simulate.workload import Deployment, build
from hybridtrace.simulate.writers import write_bundle


def simulate(options: SimOptions, out: str | Path) -> dict:
    """Write the bundle and its truth under ``out``; returns the truth."""
    started = time.monotonic()
    out = Path(out)
    deployment: Deployment = build(options)
    counts = write_bundle(deployment, out)
    findings = sorted(
        deployment.truth,
        key=lambda f: (
            f["kind"],
            f["engine_id"] or "",
            f["request_id"] or "",
            -1 if f["rank"] is None else f["rank"],
        ),
    )
    injected: dict[str, int] = {}
    natural: dict[str, int] = {}
    for finding in findings:
        bucket = injected if finding["evidence"]["injected"] else natural
        bucket[finding["kind"]] = bucket.get(finding["kind"], 0) + 1
    truth = {
        "findings": findings,
        "inputs": counts,
        "summary": {
            "injected": injected,
            "natural": natural,
            "scenario": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(options).items()},
        },
    }
    # One finding per line: readable, and quick to write for millions of requests.
    compact = {"separators": (",", ":"), "sort_keys": True}
    with open(out / "truth.json", "w") as handle:
        handle.write('{"findings":[\n')
        handle.write(",\n".join(json.dumps(f, **compact) for f in findings))
        handle.write('\n],\n"inputs":' + json.dumps(counts, **compact))
        handle.write(',\n"summary":' + json.dumps(truth["summary"], **compact) + "}\n")
    truth["seconds"] = time.monotonic() - started
    return truth


__all__ = ["INJECTABLE", "SimOptions", "parse_inject", "simulate"]
