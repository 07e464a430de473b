"""``hybridtrace demo``: simulate a deployment, ingest it, show what the store knows, write the report.

The embedded default is a small disaggregated Nemotron Nano 12B v2 deployment (one
prefill and one decode engine at TP 2, two minutes of traffic) with a slow decode rank,
some padded state and a few failed and expired reads injected.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hybridtrace.errors import UsageError
from hybridtrace.ingest.run import IngestSummary, ingest
from hybridtrace.report import write_report
from hybridtrace.report.data import rows as query_rows
from hybridtrace.simulate import SimOptions, parse_inject, simulate

DEMO_INJECT = "slow_rank,padding_leak=0.1,transfer_failed=0.02,kv_expired=0.02"


# The four byte counts of queries/accounting.sql, summed per decode engine.
_BYTES_SQL = """
SELECT engine_id, count(*) AS reads,
       sum(logical_bytes) AS logical, sum(expected_bytes) AS expected,
       sum(reserved_bytes) AS reserved, sum(transported_bytes) AS transported,
       round(sum(transported_bytes) / sum(expected_bytes), 4) AS transported_over_expected,
       count(*) FILTER (WHERE excess_bytes > 0) AS reads_over_expected
FROM transfer_bytes
WHERE status = 'ok'
GROUP BY engine_id ORDER BY engine_id
"""


@dataclass
class DemoResult:
    root: Path
    bundle: Path
    store: Path
    truth: dict
    ingest: IngestSummary
    sections: list[tuple[str, list[dict]]]
    report: Path
    seconds: float


def _findings_rows(summary: dict, truth: dict) -> list[dict]:
    injected, natural = truth["summary"]["injected"], truth["summary"]["natural"]
    return [
        {
            "kind": kind,
            "found": found,
            "injected": injected.get(kind, 0),
            "naturally true": natural.get(kind, 0),
        }
        for kind, found in summary["findings_by_kind"].items()
        if found or kind in injected or kind in natural
    ]


def run_demo(directory: str | Path | None = None, *, seed: int = 0) -> DemoResult:
    started = time.monotonic()
    root = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="hybridtrace-demo-"))
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        # an earlier demo's store would mix two runs and no longer match this truth
        raise UsageError(f"--dir {root}: not an empty folder; give a new or empty one")
    bundle, store = root / "bundle", root / "store"
    truth = simulate(SimOptions(seed=seed, inject=parse_inject(DEMO_INJECT)), bundle)
    summary = ingest([bundle], store)
    report, data = write_report(store, root / "report.html")
    analysis = data.analysis
    from hybridtrace.store.analysis import open_analysis

    con = open_analysis(store)

    def rows(sql: str) -> list[dict]:
        return query_rows(con, sql)

    sections = [
        (
            "Engines and their byte model (per rank)",
            rows(
                "SELECT engine_id, tp_size, matched_by, attention_bytes_per_token AS b_per_token, "
                "state_bytes AS s_bytes, block_tokens, mamba_padding_pct AS padding_pct "
                "FROM engine_models ORDER BY engine_id"
            ),
        ),
        (
            "Effective bandwidth per decode rank (a slow rank stands out)",
            rows(
                "SELECT engine_id, rank, reads, failed_reads, round(effective_gb_s, 2) AS gb_s, "
                "round(p50_xfer_s * 1e3, 2) AS p50_ms, round(post_share, 3) AS post_share "
                "FROM rank_bandwidth ORDER BY engine_id, rank"
            ),
        ),
        (
            "Bytes per read: logical, expected (whole blocks), reserved (padded pages), transported",
            rows(_BYTES_SQL),
        ),
        (
            "KV Transfer metrics intervals (logs) and Prometheus deltas",
            rows(
                "SELECT engine_id, source_kind, count(*) AS intervals, sum(transfers) AS transfers, "
                "round(avg(avg_mib_per_transfer), 2) AS avg_mib FROM intervals GROUP BY ALL ORDER BY ALL"
            ),
        ),
        (
            "What the logs said",
            rows("SELECT kind, count(*) AS events FROM log_events GROUP BY kind ORDER BY kind"),
        ),
        (
            "Findings (hybridtrace analyze) against the simulator's truth",
            _findings_rows(analysis.summary, truth),
        ),
    ]
    return DemoResult(root, bundle, store, truth, summary, sections, report, time.monotonic() - started)
