"""``hybridtrace demo``: what the demo simulated, what the store shows of it, and where to look next."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridtrace.output import to_pairs, to_table

if TYPE_CHECKING:
    from hybridtrace.demo import DemoResult


def demo_text(result: DemoResult) -> str:
    """The opening line, each section's table, and the commands to go on with."""
    counts = result.truth["inputs"]
    parts = [
        f"Simulated {counts['requests']:,} requests ({counts['transfers']:,} NIXL reads) of a disaggregated "
        f"Nemotron Nano 12B v2 deployment; ingested {result.ingest.objects_read} files."
    ]
    for title, rows in result.sections:
        parts.append(f"\n{title}\n")
        parts.append(to_table(rows) if rows else "(no rows)")
    injected = ", ".join(f"{k} {v}" for k, v in sorted(result.truth["summary"]["injected"].items()))
    parts.append(
        "\n"
        + to_pairs(
            [
                ("injected on purpose", injected or "none"),
                ("bundle", str(result.bundle)),
                ("truth", str(result.bundle / "truth.json")),
                ("store", str(result.store)),
                ("findings", f"hybridtrace analyze --store {result.store}"),
                (
                    "explore",
                    f'hybridtrace query "SELECT * FROM request_bytes LIMIT 10" --store {result.store}',
                ),
                ("time", f"{result.seconds:.1f} s"),
                ("report", f"{result.report}  (open it in a browser; no network needed)"),
            ]
        )
    )
    return "\n".join(parts)
