"""The analyzer: findings from the store's views, with the inputs they rest on.

Every rule is a ``finding_<kind>`` view in ``queries/``; this module runs them, counts the
inputs each could see, and shapes the result as ``analyze --format json`` prints it. It
computes nothing itself: byte counts and verdicts live in SQL.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import duckdb

from hybridtrace.analyze.thresholds import install as install_thresholds
from hybridtrace.analyze.thresholds import load as load_thresholds
from hybridtrace.kinds import KINDS

__all__ = ["KINDS", "Analysis", "analyze"]

SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}

# What each rule looks at, counted so that a rule that saw nothing says so.
RULE_INPUTS = {
    "padding_leak": "SELECT count(*) FROM transfer_bytes WHERE status = 'ok'",
    "unsharded_state": "SELECT count(*) FROM transfer_bytes WHERE status = 'ok'",
    "staging_copy": "SELECT count(*) FROM transfers",
    "useless_boundary": "SELECT count(*) FROM requests WHERE transferred_tokens IS NOT NULL",
    "descriptor_bound": "SELECT count(*) FROM transfers WHERE status = 'ok'",
    "transfer_failed": "SELECT (SELECT count(*) FROM transfers) + (SELECT count(*) FROM log_events)",
    "kv_expired": "SELECT (SELECT count(*) FROM requests) + (SELECT count(*) FROM log_events)",
    "recompute_cheaper": "SELECT count(*) FROM handoffs WHERE prefill_s IS NOT NULL",
    "slow_rank": "SELECT count(*) FROM _rank_windows WHERE peer_median_gb_s IS NOT NULL",
    "config_mismatch": "SELECT count(*) FROM (SELECT DISTINCT engine_id, remote_engine_id FROM transfers)",
    "native_padding": "SELECT count(*) FROM interval_bytes "
    "WHERE engine_id NOT IN (SELECT DISTINCT engine_id FROM transfers)",
}
_INPUT_TABLES = (
    "transfers",
    "requests",
    "engines",
    "intervals",
    "log_events",
    "prom_samples",
    "engine_models",
)


@dataclass
class Analysis:
    findings: list[dict]
    inputs: dict[str, int]
    summary: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"findings": self.findings, "inputs": self.inputs, "summary": self.summary}


def analyze(con: duckdb.DuckDBPyConnection, *, config: str | None = None) -> Analysis:
    """Run every finding rule over the store behind ``con``."""
    install_thresholds(con, load_thresholds(config))
    inputs = {name: con.sql(f"SELECT count(*) FROM {name}").fetchall()[0][0] for name in _INPUT_TABLES}
    inputs["transfers_accounted"] = con.sql("SELECT count(*) FROM transfer_bytes").fetchall()[0][0]
    findings: list[dict] = []
    by_kind: dict[str, int] = {}
    by_kind = dict.fromkeys(KINDS, 0)
    # One view per kind, plus the native-metrics padding rule (engine/interval scope).
    per_view: dict[str, int] = {}
    for view in [f"finding_{kind}" for kind in KINDS] + ["finding_native_padding"]:
        relation = con.sql(f"SELECT * FROM {view}")
        columns = relation.columns
        rows = [dict(zip(columns, row, strict=True)) for row in relation.fetchall()]
        per_view[view] = len(rows)
        for row in rows:
            row["evidence"] = json.loads(row["evidence"]) if row["evidence"] else {}
            by_kind[row["kind"]] = by_kind.get(row["kind"], 0) + 1
        findings.extend(rows)
    findings.sort(
        key=lambda f: (
            SEVERITY_ORDER.get(f["severity"], 9),
            f["kind"],
            f["engine_id"] or "",
            f["request_id"] or "",
            -1 if f["rank"] is None else f["rank"],
        )
    )
    rules = {}
    for rule, sql in RULE_INPUTS.items():
        rules[rule] = {"inputs": con.sql(sql).fetchall()[0][0], "findings": per_view[f"finding_{rule}"]}
    severities: dict[str, int] = {}
    for finding in findings:
        severities[finding["severity"]] = severities.get(finding["severity"], 0) + 1
    totals = con.sql(
        "SELECT sum(logical_bytes), sum(expected_bytes), sum(reserved_bytes), sum(transported_bytes) "
        "FROM transfer_bytes WHERE status = 'ok'"
    ).fetchall()[0]
    logical, expected, reserved, transported = totals
    summary = {
        "findings_by_kind": by_kind,
        "findings_by_severity": severities,
        "logical_bytes": logical,
        "expected_bytes": expected,
        "reserved_bytes": reserved,
        "transported_bytes": transported,
        "transported_over_expected": transported / expected if expected else None,
        "transported_over_logical": transported / logical if logical else None,
        "no_inputs": [
            name for name in ("transfers", "requests", "intervals", "log_events") if inputs[name] == 0
        ],
        "rules": rules,
        "rules_without_inputs": [rule for rule, counts in rules.items() if counts["inputs"] == 0],
    }
    return Analysis(findings, inputs, summary)
