"""``hybridtrace ingest``: walk inputs, detect each object's format, parse, commit batches.

Each object is read once: the manifest (``sources``) remembers its size, mtime and
fingerprint and the byte offset where the last read stopped. An unchanged object is
skipped; a grown one (same fingerprint of its head) is read from that offset; a changed
one is read again whole, and records the store already holds are dropped by key.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from hybridtrace.errors import UsageError
from hybridtrace.ingest.detect import detect_format
from hybridtrace.ingest.trace import parse_trace
from hybridtrace.schema import SCHEMA_VERSION, table_schema
from hybridtrace.store import Store, concat, dedupe, new_batch_id

HEAD_BYTES = 64 * 1024
BATCH_ROWS = 2_000_000
BATCH_OBJECTS = int(os.environ.get("HYBRIDTRACE_BATCH_OBJECTS", "256"))
DATA_TABLES = ("transfers", "requests", "engines", "models", "rejects")


@dataclass
class IngestSummary:
    objects_seen: int = 0
    objects_read: int = 0
    objects_skipped: int = 0
    bytes_read: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    rejects: int = 0
    duplicates: int = 0
    recovered_files: int = 0
    seconds: float = 0.0
    by_format: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        out = dict(self.__dict__)
        out["mb_per_s"] = round(self.bytes_read / 1e6 / self.seconds, 1) if self.seconds else None
        return out


def _walk(paths: Iterable[str | Path]) -> Iterator[Path]:
    for raw in paths:
        path = Path(raw)
        if "://" in str(raw):
            raise UsageError(f"{raw}: bucket inputs are not supported yet; use a local path")
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        elif path.is_file():
            yield path
        else:
            raise UsageError(f"{raw}: no such file or folder")


FINGERPRINT_BYTES = 4096


def _fingerprint(path: Path, size: int) -> str:
    """Hash of the object's first bytes (at most 4 KiB): unchanged when it only grows."""
    with open(path, "rb") as handle:
        head = handle.read(min(size, FINGERPRINT_BYTES))
    return hashlib.sha256(head).hexdigest()[:32]


def _source_id(uri: str, size: int, mtime: float, start: int) -> str:
    return hashlib.sha256(f"{uri}\0{size}\0{mtime}\0{start}".encode()).hexdigest()[:32]


def _read_body(path: Path, start: int) -> tuple[bytes, bool]:
    """Bytes from ``start``; (data, compressed). Gzip objects are read whole."""
    with open(path, "rb") as handle:
        magic = handle.read(2)
    if magic == b"\x1f\x8b":
        with gzip.open(path, "rb") as handle:
            return handle.read(), True
    with open(path, "rb") as handle:
        handle.seek(start)
        return handle.read(), False


def _complete_lines(data: bytes, is_final: bool) -> tuple[list[bytes], int]:
    """Lines of ``data`` and how many bytes they consume.

    A last line without a newline is kept only when the caller knows the object is
    complete (gzip) or the line is a complete JSON value: a writer may still be
    appending to it otherwise.
    """
    lines = data.split(b"\n")
    tail = lines.pop()
    consumed = len(data) - len(tail)
    if tail.strip():
        keep = is_final
        if not keep:
            try:
                json.loads(tail)
                keep = True
            except (ValueError, UnicodeDecodeError):
                keep = False
        if keep:
            lines.append(tail)
            consumed = len(data)
    return [line.rstrip(b"\r") for line in lines], consumed


def _reject_rows(rejects: pa.Table, source_id: str, uri: str, fmt: str, now: float) -> pa.Table:
    n = rejects.num_rows
    return pa.table(
        {
            "source_id": pa.array([source_id] * n, pa.string()),
            "uri": pa.array([uri] * n, pa.string()),
            "line_number": rejects["line_number"].cast(pa.int64()),
            "format": pa.array([fmt] * n, pa.string()),
            "reason": rejects["reason"],
            "raw": rejects["raw"],
            "ingested_at": pa.array([now] * n, pa.float64()),
        }
    )


class _Batch:
    def __init__(self) -> None:
        self.id = new_batch_id()
        self.tables: dict[str, list[pa.Table]] = {name: [] for name in DATA_TABLES}
        self.sources: list[dict] = []
        self.rows = 0

    def add(self, table: str, data: pa.Table) -> None:
        if data.num_rows:
            self.tables[table].append(data)
            self.rows += data.num_rows


def ingest(
    paths: Iterable[str | Path],
    store_root: str | Path,
    *,
    progress: bool = False,
) -> IngestSummary:
    """Ingest every object under ``paths`` into the store at ``store_root``."""
    started = time.monotonic()
    store = Store(store_root)
    store.init()
    summary = IngestSummary(recovered_files=store.recover())
    previous = _previous_reads(store)
    con = duckdb.connect(":memory:")
    batch = _Batch()
    for path in _walk(paths):
        summary.objects_seen += 1
        uri = str(path.resolve())
        stat = path.stat()
        size, mtime = stat.st_size, stat.st_mtime
        last = previous.get(uri)
        if last and last["size_bytes"] == size and last["mtime"] == mtime:
            summary.objects_skipped += 1
            continue
        fingerprint = _fingerprint(path, size)
        start, first_line = 0, 1
        if (
            last
            and last["etag"] == fingerprint
            and size > last["end_offset"]
            and last["start_offset"] is not None
        ):
            start, first_line = last["end_offset"], last["end_line"] + 1
        continued = last["format"] if start else None
        _ingest_object(con, batch, path, uri, size, mtime, fingerprint, start, first_line, continued, summary)
        if progress:
            print(
                f"\r{summary.objects_read} objects, {summary.bytes_read / 1e6:.1f} MB",
                end="",
                file=sys.stderr,
            )
        if batch.rows >= BATCH_ROWS or len(batch.sources) >= BATCH_OBJECTS:
            _commit(con, store, batch, summary)
            batch = _Batch()
    if batch.sources:
        _commit(con, store, batch, summary)
    if progress:
        print(file=sys.stderr)
    summary.seconds = time.monotonic() - started
    return summary


def _previous_reads(store: Store) -> dict[str, dict]:
    """The latest successful read of each object, by uri."""
    latest: dict[str, dict] = {}
    for row in store.sources_frame().to_pylist():
        if row["status"] not in ("ok", "empty", "unrecognised"):
            continue
        current = latest.get(row["uri"])
        if current is None or (row["end_offset"] or 0) >= (current["end_offset"] or 0):
            latest[row["uri"]] = row
    return latest


def _ingest_object(
    con: duckdb.DuckDBPyConnection,
    batch: _Batch,
    path: Path,
    uri: str,
    size: int,
    mtime: float,
    fingerprint: str,
    start: int,
    first_line: int,
    continued_format: str | None,
    summary: IngestSummary,
) -> None:
    now = time.time()
    source_id = _source_id(uri, size, mtime, start)
    row: dict = {
        "source_id": source_id,
        "batch_id": batch.id,
        "uri": uri,
        "size_bytes": size,
        "mtime": mtime,
        "etag": fingerprint,
        "start_offset": start,
        "end_offset": start,
        "end_line": first_line - 1,
        "lines": 0,
        "rows": "{}",
        "rejects": 0,
        "duplicates": 0,
        "status": "ok",
        "message": None,
        "ingested_at": now,
        "schema_version": SCHEMA_VERSION,
    }
    try:
        data, compressed = _read_body(path, start)
    except OSError as exc:
        row.update(status="error", message=f"cannot read: {exc}", format="unknown")
        batch.sources.append(row)
        return
    summary.objects_read += 1
    summary.bytes_read += len(data)
    # An appended read continues in the format its first read detected.
    fmt = continued_format or detect_format(data[:HEAD_BYTES], path.name)
    row["format"] = fmt
    summary.by_format[fmt] = summary.by_format.get(fmt, 0) + 1
    if not data.strip():
        row.update(status="empty", end_offset=size if not compressed else 0)
        batch.sources.append(row)
        return
    counts: dict[str, int] = {}
    if fmt == "connector_trace":
        lines, consumed = _complete_lines(data, is_final=compressed)
        tables, rejects = parse_trace(con, lines, first_line, source_id)
        for name, table in tables.items():
            counts[name] = table.num_rows
            batch.add(name, table)
        batch.add("rejects", _reject_rows(rejects, source_id, uri, fmt, now))
        row.update(
            lines=len(lines),
            end_line=first_line - 1 + len(lines),
            end_offset=start + consumed if not compressed else size,
            rejects=rejects.num_rows,
        )
        summary.rejects += rejects.num_rows
    elif fmt == "model_config":
        try:
            config = json.loads(data)
            name = config.get("_name_or_path") or (
                path.parent.name if path.name == "config.json" else path.stem
            )
            arch = (config.get("architectures") or [config.get("model_type")])[0]
            batch.add(
                "models",
                pa.table(
                    {
                        "model": [str(name)],
                        "architecture": [arch],
                        "config": [json.dumps(config)],
                        "ingested_at": [now],
                        "source_id": [source_id],
                        "line_number": [1],
                    }
                ),
            )
            counts["models"] = 1
            row.update(end_offset=size, lines=data.count(b"\n"), end_line=data.count(b"\n"))
        except (ValueError, UnicodeDecodeError) as exc:
            reject = pa.table({"line_number": [0], "reason": [f"config.json unreadable: {exc}"], "raw": [""]})
            batch.add("rejects", _reject_rows(reject, source_id, uri, fmt, now))
            row.update(status="error", message=str(exc), rejects=1)
            summary.rejects += 1
    else:
        # Recognised but not parsed yet (vLLM logs, Prometheus), or not telemetry at all:
        # counted in the manifest, never an error.
        row.update(
            status="unrecognised" if fmt == "unknown" else "ok",
            message=None if fmt == "unknown" else f"no {fmt} ingester in this version",
            end_offset=size,
        )
    row["rows"] = json.dumps(counts)
    batch.sources.append(row)


def _commit(con: duckdb.DuckDBPyConnection, store: Store, batch: _Batch, summary: IngestSummary) -> None:
    tables: dict[str, pa.Table] = {}
    duplicates_by_source: dict[str, int] = {}
    for name, parts in batch.tables.items():
        data = concat(parts, table_schema(name))
        if name in ("transfers", "requests", "engines", "models") and data.num_rows:
            kept, dropped = dedupe(con, store, name, data)
            if dropped:
                kept_ids = pc.value_counts(kept["source_id"]).to_pylist() if kept.num_rows else []
                all_ids = pc.value_counts(data["source_id"]).to_pylist()
                kept_map = {d["values"]: d["counts"] for d in kept_ids}
                for item in all_ids:
                    lost = item["counts"] - kept_map.get(item["values"], 0)
                    if lost:
                        duplicates_by_source[item["values"]] = (
                            duplicates_by_source.get(item["values"], 0) + lost
                        )
            data = kept
            summary.duplicates += dropped
        tables[name] = data
        summary.rows[name] = summary.rows.get(name, 0) + data.num_rows
    for row in batch.sources:
        row["duplicates"] = duplicates_by_source.get(row["source_id"], 0)
    sources = pa.Table.from_pylist(batch.sources, schema=table_schema("sources").arrow_schema())
    store.write_batch(batch.id, tables, sources)
