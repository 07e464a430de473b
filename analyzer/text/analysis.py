"""``hybridtrace analyze``: the inputs, the byte totals and the findings, as text."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridtrace.output import bytes_text, to_pairs, to_table

if TYPE_CHECKING:
    from hybridtrace.analyze import Analysis


def analysis_text(result: Analysis, limit: int) -> str:
    """Label/value lines (inputs, counts, bytes, what had no input), then the first ``limit`` findings."""
    summary, inputs = result.summary, result.inputs
    counts = ", ".join(f"{k} {v}" for k, v in summary["findings_by_kind"].items() if v) or "none"
    pairs = [
        ("inputs", ", ".join(f"{k} {v:,}" for k, v in inputs.items())),
        ("findings", f"{len(result)}: {counts}"),
    ]
    if summary["transported_bytes"] is not None:
        sizes = ", ".join(
            f"{name} {bytes_text(summary[name + '_bytes'])}"
            for name in ("logical", "expected", "reserved", "transported")
        )
        ratio = summary["transported_over_expected"]
        shown = f"{ratio:.4f}" if ratio is not None else "-"
        pairs.append(("bytes (ok reads)", f"{sizes} (transported/expected {shown}, ratio of sums)"))
    for name in summary["no_inputs"]:
        pairs.append(("no input", f"the store has no {name}: the rules that read it matched nothing"))
    if inputs.get("trace_records_dropped"):
        dropped = inputs["trace_records_dropped"]
        pairs.append(("incomplete", f"the trace writers dropped {dropped:,} records: the trace lacks them"))
    if summary["rules_without_inputs"]:
        pairs.append(("rules with no input", _rules_without_inputs(summary)))
    rows = [
        {"severity": f["severity"], "kind": f["kind"], "engine": f["engine_id"], "rank": f["rank"],
         "request": f["request_id"] or f["remote_engine_id"], "message": f["message"]}
        for f in result.rows(limit)
    ]  # fmt: skip
    out = to_pairs(pairs)
    if rows:
        out += "\n\n" + to_table(rows, right_align=["rank"])
        if len(result) > limit:
            out += f"\n... {len(result) - limit} more (--limit, or --format json for all)"
    return out


def _rules_without_inputs(summary: dict) -> str:
    """The rules that saw nothing; a kind another rule can still find says which."""
    found_by: dict[str, list[str]] = {}
    for rule, counts in summary["rules"].items():
        if counts["findings"]:
            for kind in counts.get("kinds", ()):
                found_by.setdefault(kind, []).append(rule)
    named = []
    for rule in summary["rules_without_inputs"]:
        others = [r for r in found_by.get(rule, []) if r != rule]
        named.append(f"{rule} (its kind found by {', '.join(others)})" if others else rule)
    return ", ".join(named)
