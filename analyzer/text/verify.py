"""``hybridtrace verify``: how the prompts compared and where the outputs parted, as text."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridtrace.output import to_pairs, to_table

if TYPE_CHECKING:
    from hybridtrace.verify import VerifySummary


def verify_text(summary: VerifySummary) -> str:
    """Model, counts by status, where the rows went, notes; then the prompts whose outputs parted."""
    counts = ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in summary.by_status.items())
    pairs = [
        ("model", f"{summary.model} (P/D {summary.pd_url}, control {summary.control_url})"),
        ("prompts", f"{summary.prompts}: {counts}"),
        ("store", f"{summary.store}: table verifications, run {summary.run_id}"),
        ("time", f"{summary.seconds:.2f} s"),
    ]
    pairs += [("note", note) for note in summary.notes]
    out = to_pairs(pairs)
    parted = [
        {"prompt": r["prompt_id"] or f"#{r['prompt_index']}", "status": r["status"],
         "token": r.get("first_divergence"), "of": r.get("tokens_compared"),
         "control gap": round(r["control_top_gap"], 4) if r.get("control_top_gap") is not None else None,
         "P/D id": r.get("pd_response_id")}
        for r in summary.results if r["status"] in ("mismatch", "near_tie")
    ]  # fmt: skip
    if parted:
        out += "\n\nWhere the outputs part\n\n" + to_table(parted, right_align=["token", "of"])
    return out
