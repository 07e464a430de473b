"""``hybridtrace ingest``: walk inputs, detect each object's format, parse, commit batches.

This is the orchestration only, the same for every format: the listing, bucket objects
fetched ahead, one object after another streamed in chunks of whole lines (memory stays
bounded whatever their size) through its format's parser, large objects committed in
slices, batches committed in order on a writer thread. What each piece does lives beside
it: ``formats/`` (one module per input format, and the order they are detected in),
``stream.py`` (gzip, a resumed read's start, line chunks), ``manifest.py`` (``sources``
rows and the decisions they drive: what is read again, from where, a last line without
its newline), ``batch.py`` (a batch, and its commit with duplicates dropped).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from hybridtrace.buckets import ObjectRef, is_bucket, list_objects, redact, refuse_credentials
from hybridtrace.errors import HybridtraceError, StoreWriteError, UsageError
from hybridtrace.ingest import formats
from hybridtrace.ingest.batch import Batch, commit
from hybridtrace.ingest.formats.base import Chunk, Format, LastLine, ObjectContext, Parsed, Parser
from hybridtrace.ingest.manifest import (
    FINGERPRINT_BYTES,
    fingerprint,
    is_quiet,
    last_line,
    previous_reads,
    refused_unchanged,
    resume_point,
    source_id,
    source_row,
)
from hybridtrace.ingest.progress import Progress
from hybridtrace.ingest.rows import reject_rows
from hybridtrace.ingest.stream import (
    NO_LINES,
    RAW_LIMIT,
    Lines,
    after_counted_line,
    line_chunks,
    open_from,
    prefetched,
)
from hybridtrace.ingest.summary import IngestSummary
from hybridtrace.store import CUT_RECORD, Store

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

__all__ = ["IngestOptions", "IngestSummary", "ingest"]

# DuckDB, polars and the parsers are imported when an object is first parsed: a re-run
# over unchanged input opens nothing, and should not pay for loading them either.

HEAD_BYTES = 64 * 1024  # of the first chunk, for detection
# 24 MiB, not 32: glibc serves a block of 32 MiB or more from a fresh mapping every time
# (its largest mmap threshold), so each chunk's copy would fault in new pages; below it,
# a freed chunk's memory is reused by the next one (measured: ~10 ms a copy against 40-180 ms).
CHUNK_BYTES = int(os.environ.get("HYBRIDTRACE_CHUNK_BYTES", str(24 << 20)))
BATCH_ROWS = int(os.environ.get("HYBRIDTRACE_BATCH_ROWS", "200000"))
BATCH_OBJECTS = int(os.environ.get("HYBRIDTRACE_BATCH_OBJECTS", "256"))
ERROR_MESSAGES = 10  # unreadable objects named in the summary (all are in `sources`)
# Small bucket objects are downloaded ahead of the parser (see _prefetch).
PREFETCH_BYTES = 4 << 20
PREFETCH_THREADS = 8
PREFETCH_AHEAD = 32  # at most 32 × 4 MiB held
# A last line without a newline in a file modified this recently may still be written.
QUIET_SECONDS = 60.0


@dataclass
class IngestOptions:
    year: int | None = None  # year of a log's first line (default: from the object's mtime)
    tz: str = "UTC"  # time zone of log stamps
    progress: bool = False


def _listing(paths: Iterable[str | Path]) -> tuple[list[str], list[ObjectRef]]:
    """The prefixes the inputs cover and every object under them (listing only, no reads)."""
    prefixes, objects, seen = [], [], set()
    paths = list(paths)
    for raw in paths:
        if is_bucket(str(raw)):
            refuse_credentials(str(raw))  # before anything is listed, whatever else is named
    for raw in paths:
        try:
            prefix, found = list_objects(raw)
        except UsageError:
            if len(paths) == 1:
                raise  # the one input named is not there: say so, and read nothing
            # One input of several is missing (a folder not mounted yet): an error row for
            # it, and the others are read. It covers no prefix, so nothing read from it
            # before is taken for gone.
            where = str(raw) if is_bucket(str(raw)) else str(Path(str(raw)).resolve())
            objects.append(ObjectRef(where, 0, 0.0, local=Path(str(raw)), error="no such file or folder"))
            continue
        prefixes.append(prefix)
        for obj in found:
            if obj.uri not in seen:
                seen.add(obj.uri)
                objects.append(obj)
    return prefixes, objects


def _fetch(obj: ObjectRef) -> tuple[bytes, str | None] | None:
    """A small bucket object's bytes and version, or None (then it is read in place)."""
    try:
        with obj.open() as handle:
            return handle.read(), obj.version(handle)
    except OSError:
        return None  # read in place later, where the error is recorded


def _prefetch(
    objects: list[ObjectRef], skip: Callable[[ObjectRef], bool]
) -> Iterator[tuple[ObjectRef, tuple[bytes, str | None] | None]]:
    """Each object with its bytes when it is a small bucket object that must be read.

    A bucket read waits on the network far more than on the CPU, so small objects are
    downloaded by a few threads ahead of the parser, at most PREFETCH_AHEAD at a time
    (memory stays bounded). Local files and large objects are read in place, streamed.
    """

    def wanted(obj: ObjectRef) -> bool:
        if obj.skipped is not None or obj.error is not None:
            return False  # never opened
        return obj.local is None and obj.size <= PREFETCH_BYTES and not skip(obj)

    if not any(wanted(o) for o in objects):
        yield from ((o, None) for o in objects)
        return
    with ThreadPoolExecutor(PREFETCH_THREADS, thread_name_prefix="hybridtrace-fetch") as pool:
        pending: dict[int, Future] = {}
        ahead = 0  # the next object to consider fetching
        for i, obj in enumerate(objects):
            ahead = max(ahead, i)
            while ahead < len(objects) and len(pending) < PREFETCH_AHEAD:
                if wanted(objects[ahead]):
                    pending[ahead] = pool.submit(_fetch, objects[ahead])
                ahead += 1
            future = pending.pop(i, None)
            yield obj, (future.result() if future is not None else None)


class _Ingest:
    """One run: the store, the open batch, the summary."""

    def __init__(self, store: Store | None, options: IngestOptions,
                 reads: tuple[dict[str, dict], dict[str, dict]] | None = None) -> None:  # fmt: skip
        # ``reads`` (the latest and the failed reads by uri) instead of the store's: an
        # executor reading objects for another engine's driver (hybridtrace.spark) has no store
        self.store = store
        self.options = options
        self._con: duckdb.DuckDBPyConnection | None = None
        self.batch = Batch()
        self.summary = IngestSummary()
        self.previous, self.failed = reads if reads is not None else previous_reads(store)
        self.seen: set[str] = set()  # uris of this run's listing
        self.errored_folders: list[str] = []  # folders the listing could not read
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hybridtrace-commit")
        self.progress = Progress(False, 0)
        self.done_bytes = 0  # bytes of objects walked so far, for the progress bar
        self.pending: Future | None = None
        # Objects are read in chunks of this much; a slice of a large object ends only where
        # a chunk does. An executor is told the driver's, so both cut at the same lines.
        self.chunk_bytes = CHUNK_BYTES

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """The run's DuckDB connection, opened when a parser first needs it."""
        if self._con is None:
            import duckdb

            self._con = duckdb.connect(":memory:")
        return self._con

    def connect(self) -> duckdb.DuckDBPyConnection:
        return self.con

    def maybe_commit(self, force: bool = False) -> None:
        if self.batch.sources and (
            force or self.batch.rows >= BATCH_ROWS or len(self.batch.sources) >= BATCH_OBJECTS
        ):
            # Batches commit in order on one writer thread while the next one is parsed;
            # waiting for the previous commit first keeps at most two batches in memory,
            # and lets each commit's duplicate check see the batch before it.
            self.wait()
            self.pending = self.writer.submit(commit, self.store, self.batch, self.summary)
            self.batch = Batch()

    def slice_due(self) -> bool:
        """Whether the object being read is cut here (a chunk read): the open batch is full."""
        return self.batch.rows >= BATCH_ROWS

    def new_reader(self, obj: ObjectRef, fingerprint: str, version: str | None, compressed: bool,
                   fmt: str | None, engine_id: str | None) -> _ObjectReader:  # fmt: skip
        return _ObjectReader(self, obj, fingerprint, version, compressed, fmt, engine_id)

    def wait(self) -> None:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            try:
                pending.result()
            except HybridtraceError:
                raise
            except Exception as exc:
                # not the object being read: the store could not take the batch, so the run
                # stops (a reading error would mark the object and go on, losing the batch)
                reason = redact(str(exc)) or type(exc).__name__
                raise StoreWriteError(f"cannot write the store: {reason}") from exc

    def explicit_model(self, source: str) -> None:
        from hybridtrace.ingest.formats.model_config import models_table
        from hybridtrace.model import geometry_from_config, load_config

        config, name = load_config(source)
        geometry_from_config(config, name)  # refuse a config we cannot size, now
        text = json.dumps(config, sort_keys=True)
        uri = f"model:{hashlib.sha256(text.encode()).hexdigest()[:16]}"
        # Named per run, so choosing a config used before makes it the latest choice again.
        row = self.source_row(uri, len(text), time.time(), "", 0, 1, "model_config")
        row.update(end_offset=len(text), rows=json.dumps({"models": 1}))
        self.batch.sources.append(row)
        # its origin is this run's choice: choosing a config again makes it the latest choice
        self.batch.add("models", models_table(name, config, text, row["source_id"], row["source_id"], "*"))

    def source_row(self, uri: str, size: int | None, mtime: float | None, fingerprint: str, start: int,
                   first_line: int, fmt: str | None, version: str | None = None) -> dict:  # fmt: skip
        return source_row(self.batch.id, uri, size, mtime, fingerprint, start, first_line, fmt, version)

    def error(self, row: dict, message: str) -> None:
        """Mark an object's manifest row as unreadable, and count it for the summary."""
        row.update(status="error", message=message)
        self._count_error(row["uri"], message)

    def _count_error(self, uri: str, message: str) -> None:
        self.summary.errors += 1
        if len(self.summary.error_messages) < ERROR_MESSAGES:
            self.summary.error_messages.append(f"{redact(uri)}: {message}")

    def left_out(self, obj: ObjectRef) -> None:
        """A manifest row for an object the listing says not to open, once: a later run that
        lists it as it was finds it unchanged, so the manifest does not grow run after run."""
        last = self.previous.get(obj.uri)
        if last is not None and last["status"] == "skipped" and self.listed_unchanged(obj):
            self.summary.objects_skipped += 1
            return
        row = self.source_row(obj.uri, obj.size, obj.mtime, "", 0, 1, "unknown")
        row.update(status="skipped", message=obj.skipped)
        self.batch.sources.append(row)
        self.summary.objects_left_out += 1
        if len(self.summary.left_out_messages) < ERROR_MESSAGES:
            self.summary.left_out_messages.append(f"{redact(obj.uri)}: {obj.skipped}")

    def listed_unchanged(self, obj: ObjectRef) -> bool:
        """True when the listing alone says the object is as last read (nothing to open)."""
        return self.may_be_unchanged(obj) and self.previous[obj.uri]["mtime"] == obj.mtime

    def may_be_unchanged(self, obj: ObjectRef) -> bool:
        """True when the object is unchanged, or may be (same size: its version will say)."""
        last = self.previous.get(obj.uri)
        return bool(last and last["status"] not in ("partial", "deleted") and last["size_bytes"] == obj.size)

    def needs_no_download(self, obj: ObjectRef) -> bool:
        """True when the object may not have to be read whole (see _prefetch)."""
        return self.may_be_unchanged(obj) or refused_unchanged(self.failed.get(obj.uri), obj)

    def object(self, obj: ObjectRef, fetched: tuple[bytes, str | None] | None = None) -> None:
        """Read one object (``fetched``: its bytes and version, already downloaded)."""
        summary = self.summary
        summary.objects_seen += 1
        uri, size, mtime = obj.uri, obj.size, obj.mtime
        self.seen.add(uri)
        if obj.error is not None:  # the listing could not read it (an unreadable folder)
            if obj.local is not None and obj.local.is_dir():
                self.errored_folders.append(uri)
            self.batch.sources.append(self.source_row(uri, size, mtime, "", 0, 1, "unknown"))
            self.error(self.batch.sources[-1], obj.error)
            return
        if obj.skipped is not None:
            self.left_out(obj)
            return
        failed = self.failed.get(uri)
        if refused_unchanged(failed, obj):
            # its format refused it, and it has not changed since: the same error again,
            # without reading it or adding a row (the row that says why is there)
            summary.objects_skipped += 1
            self.done_bytes += size
            self._count_error(uri, f"{failed['message']} (unchanged since it was read)")
            return
        last = self.previous.get(uri)
        unchanged = self.may_be_unchanged(obj)
        if self.listed_unchanged(obj):
            summary.objects_skipped += 1
            self.done_bytes += size
            return
        raw = None
        try:
            # one open per object: in a bucket every open is a request
            if fetched is not None:
                raw, version = io.BytesIO(fetched[0]), fetched[1]
            else:
                raw = obj.open()
                version = obj.version(raw)
            head = raw.read(FINGERPRINT_BYTES)
        except OSError as exc:
            if raw is not None:
                raw.close()
            self.batch.sources.append(self.source_row(uri, size, mtime, "", 0, 1, "unknown"))
            self.error(self.batch.sources[-1], f"cannot read: {redact(exc.strerror or str(exc))}")
            return
        if unchanged and last is not None and version is not None and version == last["version"]:
            raw.close()
            # rewritten with the same content (same ETag): note the new time, so the next
            # listing alone says unchanged
            row = {**last, "source_id": source_id(uri, size, mtime, last["start_offset"] or 0),
                   "batch_id": self.batch.id, "mtime": mtime, "rows": "{}", "lines": 0, "rejects": 0,
                   "duplicates": 0, "ingested_at": time.time(),
                   "message": "rewritten, same version"}  # fmt: skip
            self.batch.sources.append(row)
            summary.objects_skipped += 1
            self.done_bytes += size
            return
        compressed = head[:2] == b"\x1f\x8b"
        head_hash = fingerprint(head[:size])
        binary = None if compressed else formats.detect_binary(head, obj.name, size)
        if binary is not None:
            self._snapshot(binary, obj, raw, head, head_hash, version)
            return
        point = resume_point(last, obj, head, compressed)
        start = point.start
        try:
            if start and not compressed:
                start = after_counted_line(raw, start)
            handle = open_from(raw, start, compressed, self.chunk_bytes)
        except (OSError, EOFError, zlib.error) as exc:
            raw.close()
            self.batch.sources.append(
                self.source_row(uri, size, mtime, head_hash, start, point.first_line, "unknown", version)
            )
            self.error(self.batch.sources[-1], f"cannot read: {redact(str(exc))}")
            return
        reader = self.new_reader(obj, head_hash, version, compressed, point.fmt, point.engine_id)
        reader.resume_ts = point.resume_ts
        reader.previous = point.previous
        try:
            with handle:
                summary.objects_read += 1
                reader.run(handle, start, point.first_line)
        except (OSError, EOFError, zlib.error) as exc:
            # a corrupt or truncated object (a cut .gz, a read that failed half-way): what was
            # read stays, the object is marked, and the run goes on; the next run tries again
            self.error(reader.fail(), f"cannot read: {redact(str(exc)) or type(exc).__name__}")
        self.done_bytes += size
        self.progress.update(summary, self.done_bytes)
        self.maybe_commit()

    def _snapshot(self, fmt: Format, obj: ObjectRef, raw: BinaryIO, head: bytes, head_hash: str,
                  version: str | None) -> None:  # fmt: skip
        """An object of a format never read in lines (Resume.NONE): read whole, in one piece,
        and parsed once; each read is a snapshot of it (see formats.base)."""
        row = self.source_row(obj.uri, obj.size, obj.mtime, head_hash, 0, 1, fmt.name, version)
        self.batch.sources.append(row)
        self.summary.objects_read += 1
        self.summary.by_format[fmt.name] = self.summary.by_format.get(fmt.name, 0) + 1
        try:
            with raw:
                data = head + raw.read()
        except OSError as exc:
            self.error(row, f"cannot read: {redact(exc.strerror or str(exc))}")
            return
        context = ObjectContext(obj, self.options.year, self.options.tz, self.connect)
        parsed = fmt.parser(context).feed(Chunk(Lines(data, 1), 1, True, row["source_id"]))
        counts: dict[str, int] = {}
        for name, table in parsed.tables:
            self.batch.add(name, table)
            counts[name] = counts.get(name, 0) + table.num_rows
        for rejects in parsed.rejects:
            table = reject_rows(rejects, row["source_id"], obj.uri, fmt.name, time.time())
            row["rejects"] += table.num_rows
            self.summary.rejects += table.num_rows
            self.batch.add("rejects", table)
        if parsed.error is not None:
            self.error(row, redact(parsed.error))
            return
        records = parsed.lines or 0
        row.update(rows=json.dumps(counts), end_offset=obj.size, end_line=records, lines=records)
        self.summary.bytes_read += obj.size
        self.done_bytes += obj.size
        self.progress.update(self.summary, self.done_bytes)
        self.maybe_commit()

    def note_gone(self, prefixes: list[str]) -> None:
        """A manifest row for each object read before that its folder or prefix no longer has."""
        unlisted = [uri.rstrip("/" + os.sep) for uri in self.errored_folders]
        for uri, last in self.previous.items():
            if uri in self.seen or last["status"] == "deleted":
                continue
            if any(uri.startswith(folder + os.sep) or uri.startswith(folder + "/") for folder in unlisted):
                continue  # under a folder this run could not list: not gone, unseen
            # a prefix covers what is under it; a named object that is gone lists as a prefix
            if not any(uri == prefix.rstrip("/" + os.sep)
                       or (prefix.endswith(("/", os.sep)) and uri.startswith(prefix))
                       for prefix in prefixes):  # fmt: skip
                continue
            row = self.source_row(uri, None, None, last["etag"], last["end_offset"] or 0,
                                  (last["end_line"] or 0) + 1, last["format"], last["version"])  # fmt: skip
            # its own id: an object can go, come back and go again
            row.update(status="deleted", message="gone from its listing; the rows read from it stay",
                       engine_id=last["engine_id"],
                       source_id=source_id(uri, -1, row["ingested_at"], row["start_offset"]))  # fmt: skip
            self.batch.sources.append(row)
            self.summary.objects_gone += 1


class _ObjectReader:
    """Streams one object through its format's parser, committing slices as batches fill."""

    def __init__(self, run: _Ingest, obj: ObjectRef, fingerprint: str, version: str | None,
                 compressed: bool, fmt: str | None, engine_id: str | None) -> None:  # fmt: skip
        self.job, self.obj, self.uri = run, obj, obj.uri
        self.size, self.mtime, self.fingerprint = obj.size, obj.mtime, fingerprint
        self.compressed = compressed
        self.version = version
        self.fmt = fmt  # the format's name, as the manifest says it ("unknown", "empty" too)
        self.format: Format | None = formats.by_name(fmt)
        self.parser: Parser | None = None
        self.engine_id = engine_id
        self.row: dict | None = None  # the manifest row of the slice being read
        self.resume_ts: float | None = None  # a resumed log's latest stamp so far
        self.cut_record = False  # the last record was cut short for good: a reject, not held back
        self.previous: dict | None = None  # the manifest row of the read this one goes on from
        self.manifest: dict = {}  # the format's own manifest columns, as its parser last set them

    def fail(self) -> dict:
        """Close the read's open manifest row (or add one) for the run to mark as an error."""
        row = self.row
        if row is None or "counts" not in row:
            row = self._new_row(self.row["end_offset"] if self.row else 0, 1)
        self._close_row(row)
        row["format"] = self.fmt or "unknown"
        return row

    def _detect(self, row: dict, lines: Lines, tail: bytes) -> None:
        """Decide the format from the first chunk: its whole lines, and the line after them
        that no newline ends yet (a short object's last line says as much as the others)."""
        from hybridtrace.ingest.detect import detect_format

        head = (lines.block + b"\n" + tail if tail else lines.block) if lines else tail
        head = head[:HEAD_BYTES]
        self.fmt = detect_format(head, self.obj.name) if head.strip() else formats.EMPTY
        self.format = formats.by_name(self.fmt)
        row["format"] = self.fmt
        self.job.summary.by_format[self.fmt] = self.job.summary.by_format.get(self.fmt, 0) + 1

    def run(self, handle: BinaryIO, start: int, first_line: int) -> None:
        offset, line = start, first_line
        row = self._new_row(offset, line)
        quiet = is_quiet(self.obj, self.compressed, QUIET_SECONDS)
        # the next chunk is read while this one is parsed; closing stops that reader before the
        # handle is closed, whether the loop ends or raises
        chunks = prefetched(line_chunks(handle, self.job.chunk_bytes))
        with contextlib.closing(chunks):
            for lines, consumed, tail in chunks:
                final = not lines and not consumed
                if self.fmt is None:
                    self._detect(row, lines, tail)
                if final:
                    lines, consumed = self._last_line(row, tail, line, quiet)
                self.job.summary.bytes_read += consumed
                self.job.progress.update(
                    self.job.summary, self.job.done_bytes + min(offset + consumed, self.size)
                )
                kept_back = self._parse(row, lines, line, final, quiet)
                line += len(lines)
                offset += consumed
                row["end_offset"] = offset - kept_back[0]
                row["end_line"] = line - 1 - kept_back[1]
                row["lines"] = row["end_line"] - (row["start_line"] - 1)
                if not final and self.job.slice_due():
                    # Commit what is parsed so far as a slice; the rest is a continued read.
                    row["status"] = "partial"
                    self._close_row(row)
                    self.job.maybe_commit(force=True)
                    row = self._new_row(row["end_offset"], row["end_line"] + 1)
        if self.fmt in (None, formats.EMPTY):
            row.update(status="empty", format=formats.EMPTY)
        elif self.format is None:
            row.update(status="unrecognised")
        elif not self.compressed and row["end_offset"] < self.size and not self.cut_record:
            # a last line still being written was held back: the next run reads it, even if
            # the object has not changed by then
            row["status"] = "partial"
        self._close_row(row)

    def _last_line(self, row: dict, tail: bytes, number: int, quiet: bool) -> tuple[Lines, int]:
        """What to parse of an object's last line when no newline ends it: (lines, bytes taken)."""
        rule = last_line(self.format, tail, quiet)
        if rule is None:
            return NO_LINES, len(tail)  # trailing blanks
        if rule is LastLine.TAKE:
            return Lines(tail, 1), len(tail)
        if rule is LastLine.CUT:
            # Cut short for good: a reject, once. The read stops before the line, so an
            # object that grows after all has it read whole, and then the store's rejects
            # view drops this one (see store.CUT_RECORD): never a fragment, never twice.
            raw = tail[:RAW_LIMIT].decode("utf-8", "backslashreplace")
            self._reject(row, [{"line_number": number, "reason": CUT_RECORD, "raw": raw}])
            self.cut_record = True
        return NO_LINES, 0  # a line still being written: read by a later run

    def _new_row(self, offset: int, line: int) -> dict:
        row = self.job.source_row(
            self.uri, self.size, self.mtime, self.fingerprint, offset, line, self.fmt, self.version
        )
        row["start_line"] = line
        row["counts"] = {}
        row["engine_id"] = self.engine_id
        row.update(self.manifest)
        self.job.batch.sources.append(row)
        self.row = row
        return row

    def _close_row(self, row: dict) -> None:
        if "counts" not in row:
            return  # closed already
        if self.parser is not None:
            row["end_ts"] = self.parser.latest_ts()
        row["rows"] = json.dumps(row.pop("counts"))
        row.pop("start_line", None)
        row["batch_id"] = self.job.batch.id

    def _reject(self, row: dict, rejects: list[dict] | pa.Table) -> None:
        table = reject_rows(rejects, row["source_id"], self.uri, self.fmt or "unknown", time.time())
        row["rejects"] += table.num_rows
        self.job.summary.rejects += table.num_rows
        self.job.batch.add("rejects", table)

    def _parse(
        self, row: dict, lines: Lines, first_line: int, final: bool, quiet: bool = True
    ) -> tuple[int, int]:
        """Parse ``lines``; returns (bytes, lines) held back for the next chunk."""
        if self.format is None:
            return 0, 0  # unknown or empty: read through, nothing to parse
        if self.parser is None:
            context = ObjectContext(self.obj, self.job.options.year, self.job.options.tz, self.job.connect,
                                    engine_id=self.engine_id, resume_ts=self.resume_ts,
                                    previous=self.previous)  # fmt: skip
            self.parser = self.format.parser(context)
        parsed: Parsed = self.parser.feed(Chunk(lines, first_line, final, row["source_id"], quiet))
        for name, table in parsed.tables:
            row["counts"][name] = row["counts"].get(name, 0) + table.num_rows
            self.job.batch.add(name, table)
        for rejects in parsed.rejects:
            self._reject(row, rejects)
        if parsed.learned_engine_id is not None:
            self.engine_id = parsed.learned_engine_id
        if parsed.engine_id is not None:
            row["engine_id"] = parsed.engine_id
        if parsed.manifest:
            self.manifest.update(parsed.manifest)
            row.update(parsed.manifest)
        if parsed.error is not None:
            self.job.error(row, parsed.error)
        self._took(row, parsed)
        return parsed.kept_back

    def _took(self, row: dict, parsed: Parsed) -> None:
        """What a reader of another engine notes of each parse (hybridtrace.spark.tasks)."""


def ingest(
    paths: Iterable[str | Path],
    store_root: str | Path,
    *,
    progress: bool = False,
    year: int | None = None,
    tz: str = "UTC",
    model: str | None = None,
    read_objects: Callable[[_Ingest, list[ObjectRef]], None] | None = None,
) -> IngestSummary:
    """Ingest every object under ``paths`` into the store at ``store_root``.

    ``model`` (a config.json path or built-in name) is the config every engine serves,
    whatever the engines call their model. ``read_objects`` reads the listed objects into
    the run in their order instead of this process (``hybridtrace.spark.ingest``: parsed on
    executors); the listing, recovery, the manifest's gone rows and every commit stay here.
    """
    try:
        from zoneinfo import ZoneInfo

        ZoneInfo(tz)
    except Exception as exc:
        raise UsageError(f"--tz: unknown time zone {tz!r}") from exc
    started = time.monotonic()
    if model is not None:
        from hybridtrace.model import geometry_from_config, load_config

        geometry_from_config(*load_config(model))  # a bad --model fails before the store is touched
    prefixes, objects = _listing(paths)  # a listing only: nothing is read yet
    if not is_bucket(str(store_root)):
        # a store kept inside an input folder is not telemetry: its own files are skipped
        inside = str(Path(store_root).resolve()) + os.sep
        objects = [o for o in objects if not o.uri.startswith(inside)]
    store = Store(store_root)
    store.init()
    with store.writer_lock():
        recovered = store.recover()
        run = _Ingest(store, IngestOptions(year=year, tz=tz, progress=progress))
        run.summary.recovered_files = recovered
        if model is not None:
            run.explicit_model(model)
        run.progress = Progress(progress, sum(o.size for o in objects))
        try:
            if read_objects is not None:
                read_objects(run, objects)
            else:
                for obj, fetched in _prefetch(objects, run.needs_no_download):
                    run.object(obj, fetched)
            run.note_gone(prefixes)
            run.maybe_commit(force=True)
        finally:
            try:
                run.wait()
            finally:
                run.writer.shutdown(wait=True)
        # many small runs leave many small files: merge them now and then (every batch is
        # committed by now, so a compaction that fails costs nothing but its own work)
        try:
            run.summary.compacted_batches = store.compact()
        except (OSError, HybridtraceError) as exc:
            run.summary.compaction_error = redact(str(exc))
    run.progress.update(run.summary, run.done_bytes, force=True)
    run.progress.close()
    run.summary.seconds = time.monotonic() - started
    return run.summary
