"""``hybridtrace ingest``: what a run read, kept, rejected and could not read, as text."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridtrace.output import to_pairs

if TYPE_CHECKING:
    from hybridtrace.ingest.run import IngestSummary


def ingest_text(summary: IngestSummary) -> str:
    """Objects, formats, rows, rejects, duplicates and time, one line each."""
    result = summary.as_dict()
    rows = ", ".join(f"{name} {count:,}" for name, count in sorted(result["rows"].items()) if count) or "none"
    formats = ", ".join(f"{name} {count}" for name, count in sorted(result["by_format"].items())) or "none"
    rate = f"{result['mb_per_s']} MB/s" if result["mb_per_s"] is not None else "-"
    unreadable = f"{summary.errors:,} (see sources where status = 'error')"
    objects = (
        f"{summary.objects_seen} seen, {summary.objects_read} read, {summary.objects_skipped} unchanged"
        + (f", {summary.objects_gone} gone since the last run" if summary.objects_gone else "")
        + (f", {summary.objects_left_out} left out (see sources where status = 'skipped')"
           if summary.objects_left_out else "")
    )  # fmt: skip
    return to_pairs(
        [
            ("objects", objects),
            ("formats", formats),
            ("rows", rows),
            ("rejects", f"{summary.rejects:,}"),
            ("duplicates skipped", f"{summary.duplicates:,}"),
            ("time", f"{summary.seconds:.2f} s, {summary.bytes_read / 1e6:.1f} MB read, {rate}"),
        ]
        + ([("unreadable", unreadable)] if summary.errors else [])
    )
