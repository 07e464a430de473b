"""The manifest (``sources``): its rows, and the decisions it drives — what a later run reads
again, from where, and what becomes of an object's last line when no newline ends it.

- An unchanged object is skipped; so is one whose content its format refused (a
  ``config.json`` that is no JSON) while it stays unchanged: reading it again would say
  the same. One the run could not read (a permission, a read cut short) is tried again.
- A grown one (same first bytes), of a format read by lines, is read on from that offset;
  a slice of one left ``partial`` is read on from its end.
- Anything else that changed is read again whole.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hybridtrace.ingest.formats import by_name
from hybridtrace.ingest.formats.base import Format, LastLine, Resume
from hybridtrace.schema import SCHEMA_VERSION

if TYPE_CHECKING:
    from hybridtrace.buckets import ObjectRef
    from hybridtrace.store import Store

FINGERPRINT_BYTES = 4096
# How an error the run met says so (an unreadable file or folder, a read cut short): such
# an object is read again by the next run. Any other error is its format's verdict on it.
RUN_ERRORS = ("cannot read", "cannot list", "no such file")


def fingerprint(head: bytes) -> str:
    """Hash of the object's first bytes (at most 4 KiB): unchanged when it only grows."""
    return hashlib.sha256(head[:FINGERPRINT_BYTES]).hexdigest()[:32]


def source_id(uri: str, size: int | None, mtime: float | None, start: int) -> str:
    return hashlib.sha256(f"{uri}\0{size}\0{mtime}\0{start}".encode()).hexdigest()[:32]


def source_row(batch_id: str, uri: str, size: int | None, mtime: float | None, fingerprint: str, start: int,
               first_line: int, fmt: str | None, version: str | None = None) -> dict:  # fmt: skip
    """A manifest row for a read of ``uri`` starting at byte ``start`` (line ``first_line``)."""
    return {
        "source_id": source_id(uri, size, mtime, start),
        "batch_id": batch_id,
        "uri": uri,
        "format": fmt,
        "size_bytes": size,
        "mtime": mtime,
        "etag": fingerprint,
        "version": version,
        "start_offset": start,
        "end_offset": start,
        "end_line": first_line - 1,
        "lines": 0,
        "end_ts": None,
        "rows": "{}",
        "rejects": 0,
        "duplicates": 0,
        "status": "ok",
        "message": None,
        "engine_id": None,
        "envelope": None,
        "instances": None,
        "ingested_at": time.time(),
        "schema_version": SCHEMA_VERSION,
    }


def _newer(row: dict, than: dict | None) -> bool:
    return than is None or (row["ingested_at"], row["end_offset"] or 0) >= (
        than["ingested_at"],
        than["end_offset"] or 0,
    )


def previous_reads(store: Store) -> tuple[dict[str, dict], dict[str, dict]]:
    """The latest read of each object by uri, and the objects whose latest read failed
    (their error rows, by uri)."""
    latest: dict[str, dict] = {}
    failed: dict[str, dict] = {}
    for row in store.sources_frame().to_pylist():
        target = failed if row["status"] == "error" else latest
        if _newer(row, target.get(row["uri"])):
            target[row["uri"]] = row
    # a failure an ok read came after is over
    return latest, {uri: row for uri, row in failed.items() if _newer(row, latest.get(uri))}


def refused_unchanged(failed: dict | None, obj: ObjectRef) -> bool:
    """True when the object's last read failed on its content (not on the run's reading)
    and the listing says it has not changed since: the next read would fail the same way."""
    if failed is None or (failed["message"] or "").startswith(RUN_ERRORS):
        return False
    return failed["size_bytes"] == obj.size and failed["mtime"] == obj.mtime


@dataclass
class ResumePoint:
    """Where a read starts: byte and line, and what the read before it found out."""

    start: int = 0
    first_line: int = 1
    fmt: str | None = None  # None: detect the format again
    engine_id: str | None = None
    resume_ts: float | None = None
    previous: dict | None = None  # the manifest row of the read this one goes on from


def resume_point(last: dict | None, obj: ObjectRef, head: bytes, compressed: bool) -> ResumePoint:
    """Where to read ``obj`` from, given its last read and its first bytes ``head``."""
    # A read that found nothing it knows (a launcher banner before the first vLLM line) is
    # not resumed: the whole object is looked at again. An object of a format read whole
    # (a scrape, a config) is read again from the start when it changes.
    fmt = by_name(last["format"]) if last else None
    if last is None or fmt is None or fmt.resume is not Resume.LINES or not last["end_offset"]:
        return ResumePoint()
    same_object = last["size_bytes"] == obj.size and last["mtime"] == obj.mtime
    grown = (
        not compressed
        and last["size_bytes"] is not None
        and obj.size > last["end_offset"]
        and fingerprint(head[: last["size_bytes"]]) == last["etag"]
    )
    if (same_object and last["status"] == "partial") or grown:
        return ResumePoint(last["end_offset"], last["end_line"] + 1, last["format"], last["engine_id"],
                           last.get("end_ts"), last)  # fmt: skip
    return ResumePoint()


def is_quiet(obj: ObjectRef, compressed: bool, quiet_seconds: float) -> bool:
    """Whether the object can no longer grow: nothing more of its last line will come.

    A bucket object is whole once uploaded, a gzip is never appended to, and a local file
    untouched for ``quiet_seconds`` has gone quiet. A modification time far ahead of this
    clock is no sign of a writer at work either (a copy that kept another machine's times):
    only a time within ``quiet_seconds`` of now, on either side, is.
    """
    return compressed or obj.local is None or abs(time.time() - obj.mtime) > quiet_seconds


def last_line(fmt: Format | None, tail: bytes, quiet: bool) -> LastLine | None:
    """What becomes of an object's last line ``tail`` that no newline ends: None when it is
    only blanks (taken, as nothing); else the format's rule (a format not known: the usual one)."""
    if not tail.strip():
        return None
    if fmt is None:
        return LastLine.TAKE if quiet else LastLine.WAIT
    return fmt.last_line(tail, quiet)
