"""``hybridtrace simulate``: what a simulated bundle holds and what was injected into it, as text."""

from __future__ import annotations

from hybridtrace.output import to_pairs


def simulate_text(out: str, truth: dict) -> str:
    """Records, native metrics, injected and naturally true findings, where the truth is."""
    counts = truth["inputs"]
    injected = ", ".join(f"{k} {v}" for k, v in sorted(truth["summary"]["injected"].items())) or "none"
    natural = ", ".join(f"{k} {v}" for k, v in sorted(truth["summary"]["natural"].items())) or "none"
    return to_pairs(
        [
            ("bundle", out),
            ("records", f"{counts['requests']:,} requests, {counts['transfers']:,} reads, "
                        f"{counts['engines']} engines"),
            ("native", f"{counts['log_intervals']} KV Transfer metrics lines, "
                       f"{counts['prom_scrapes']} scrapes"),
            ("injected", injected),
            ("also true", natural),
            ("truth", f"{out}/truth.json"),
            ("time", f"{truth['seconds']:.2f} s"),
        ]
    )
