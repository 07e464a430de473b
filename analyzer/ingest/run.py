"""``hybridtrace ingest``: walk inputs, detect each object's format, parse, commit batches.

Objects are streamed in chunks of whole lines, so memory stays bounded whatever their
size. The manifest (``sources``) records, per read, the object's size, mtime, a
fingerprint of its first bytes and the offset (and line) where the read stopped:

- an unchanged object is skipped;
- a grown one (same first bytes) is read on from that offset;
- a large one is committed in slices, each with its own manifest row (status
  ``partial`` until the last), so a killed run resumes where the last slice ended;
- a changed one is read again whole, and records the store already holds are dropped by
  their table key (a rotated ``.gz`` copy of a live log adds nothing either).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import pyarrow as pa
import pyarrow.compute as pc

from hybridtrace.buckets import ObjectRef, is_bucket, list_objects, redact, refuse_credentials
from hybridtrace.errors import HybridtraceError, StoreWriteError, UsageError
from hybridtrace.ingest.nixl_ring import RingError, looks_like_ring, parse_ring, ring_tables
from hybridtrace.schema import SCHEMA_VERSION, table_schema
from hybridtrace.store import CUT_RECORD, Store, concat, dedupe, new_batch_id

if TYPE_CHECKING:
    import duckdb
    import polars as pl

    from hybridtrace.ingest import vllm_log

# DuckDB, polars and the parsers are imported when an object is first parsed: a re-run
# over unchanged input opens nothing, and should not pay for loading them either.

HEAD_BYTES = 64 * 1024
FINGERPRINT_BYTES = 4096
CHUNK_BYTES = int(os.environ.get("HYBRIDTRACE_CHUNK_BYTES", str(32 << 20)))
BATCH_ROWS = int(os.environ.get("HYBRIDTRACE_BATCH_ROWS", "200000"))
BATCH_OBJECTS = int(os.environ.get("HYBRIDTRACE_BATCH_OBJECTS", "256"))
ERROR_MESSAGES = 10  # unreadable objects named in the summary (all are in `sources`)
# Small bucket objects are downloaded ahead of the parser (see _prefetch).
PREFETCH_BYTES = 4 << 20
PREFETCH_THREADS = 8
PREFETCH_AHEAD = 32  # at most 32 × 4 MiB held
# A last line without a newline in a file modified this recently may still be written.
QUIET_SECONDS = 60.0
DATA_TABLES = (
    "transfers",
    "requests",
    "engines",
    "models",
    "intervals",
    "log_events",
    "prom_samples",
    "rejects",
    "nixl_transfers",
    "nixl_rings",
)
# Read whole each time they change (their rows dedupe against what the store holds): a
# scrape or a config is one whole; another engine's CSV needs its header line.
WHOLE_FORMATS = ("unknown", "empty", "prometheus", "model_config", "trtllm_csv", "sglang", None)
DEDUPED = ("transfers", "requests", "engines", "models", "intervals", "log_events", "prom_samples", "rejects",
           "nixl_transfers", "nixl_rings")


@dataclass
class IngestOptions:
    year: int | None = None  # year of a log's first line (default: from the object's mtime)
    tz: str = "UTC"  # time zone of log stamps
    progress: bool = False


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
    objects_gone: int = 0
    compacted_batches: int = 0
    compaction_error: str | None = None
    errors: int = 0  # objects (or folders) that could not be read; the run went on without them
    error_messages: list[str] = field(default_factory=list)  # the first few, "uri: why"
    objects_left_out: int = 0  # listed but not to be read (a link out of the input, a FIFO), said once
    left_out_messages: list[str] = field(default_factory=list)  # the first few, "uri: why"
    seconds: float = 0.0
    by_format: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        out = dict(self.__dict__)
        out["mb_per_s"] = round(self.bytes_read / 1e6 / self.seconds, 1) if self.seconds else None
        return out


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


def _fingerprint(head: bytes) -> str:
    """Hash of the object's first bytes (at most 4 KiB): unchanged when it only grows."""
    return hashlib.sha256(head[:FINGERPRINT_BYTES]).hexdigest()[:32]


def _after_counted_line(handle: BinaryIO, offset: int) -> int:
    """Where the next unread line starts: ``offset``, unless the last read took a last line
    that had no newline yet (the file had gone quiet). Whatever was written after it, up
    to its newline, is the rest of that line, which is counted already: it is passed over,
    so no fragment is read as a line of its own and the numbering stays right."""
    if offset < 1:
        return offset
    handle.seek(offset - 1)
    if handle.read(1) == b"\n":
        return offset
    position = offset
    while block := handle.read(1 << 16):
        cut = block.find(b"\n")
        if cut >= 0:
            return position + cut + 1
        position += len(block)
    return position  # still no newline: all that was added continues the line


def _source_id(uri: str, size: int, mtime: float, start: int) -> str:
    return hashlib.sha256(f"{uri}\0{size}\0{mtime}\0{start}".encode()).hexdigest()[:32]


class _Gunzip(gzip.GzipFile):
    """A gzip reader that also closes the handle it reads from."""

    def __init__(self, raw: BinaryIO) -> None:
        super().__init__(fileobj=raw, mode="rb")
        self._raw = raw
        self._cut: BaseException | None = None

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes; a stream cut short gives what came before the cut first,
        and its error on the next read (a plain GzipFile drops the whole request)."""
        if self._cut is not None:
            raise self._cut
        if size is None or size < 0:
            size = 1 << 62
        parts, got = [], 0
        while got < size:
            try:
                piece = super().read(min(size - got, 1 << 16))
            except (EOFError, zlib.error, OSError) as exc:
                if not parts:
                    raise
                self._cut = exc
                break
            if not piece:
                break
            parts.append(piece)
            got += len(piece)
        return b"".join(parts)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


def _from(raw: BinaryIO, start: int, compressed: bool) -> BinaryIO:
    """The (decompressed) bytes of an open object from ``start``; closing it closes ``raw``."""
    raw.seek(0 if compressed else start)
    if not compressed:
        return raw
    handle: BinaryIO = _Gunzip(raw)  # type: ignore[assignment]
    remaining = start
    while remaining:
        skipped = handle.read(min(remaining, CHUNK_BYTES))
        if not skipped:
            break
        remaining -= len(skipped)
    return handle


def _seekable_line_chunks(handle: BinaryIO) -> Iterator[tuple[_Lines, int, bytes]]:
    """As _line_chunks, for a plain file: seek back over the partial last line instead of
    carrying it, which saves a copy of every chunk."""
    while True:
        data = handle.read(CHUNK_BYTES)
        if not data:
            yield _Lines(b"", 0), 0, b""
            return
        cut = data.rfind(b"\n")
        if cut < 0 or len(data) < CHUNK_BYTES:
            break  # one long line, or the end of the file: finish the simple way
        handle.seek(cut + 1 - len(data), os.SEEK_CUR)
        yield _Lines(data[:cut], data.count(b"\n", 0, cut) + 1), cut + 1, b""
    pending = data
    while True:
        cut = pending.rfind(b"\n")
        if cut >= 0:
            yield _Lines(pending[:cut], pending.count(b"\n", 0, cut) + 1), cut + 1, pending[cut + 1 :]
            pending = pending[cut + 1 :]
        block = handle.read(CHUNK_BYTES)
        if not block:
            break
        pending += block
    yield _Lines(b"", 0), 0, pending


class _Lines:
    """A block of whole lines (no final newline): split only by parsers that need it."""

    __slots__ = ("_split", "block", "count")

    def __init__(self, block: bytes, count: int | None = None) -> None:
        self.block = block
        self.count = (block.count(b"\n") + 1 if block else 0) if count is None else count
        self._split: list[bytes] | None = None

    def __len__(self) -> int:
        return self.count

    def split(self) -> list[bytes]:
        if self._split is None:
            self._split = self.block.split(b"\n") if self.count else []
        return self._split


def _line_chunks(handle: BinaryIO) -> Iterator[tuple[_Lines, int, bytes]]:
    """(complete lines, bytes they take, unterminated tail so far) per chunk read."""
    if handle.seekable() and not isinstance(handle, gzip.GzipFile):
        yield from _seekable_line_chunks(handle)
        return
    pending = b""
    while True:
        block = handle.read(CHUNK_BYTES)
        if not block:
            break
        data = pending + block
        cut = data.rfind(b"\n")
        if cut < 0:
            pending = data
            continue
        pending = data[cut + 1 :]
        yield _Lines(data[:cut], data.count(b"\n", 0, cut) + 1), cut + 1, pending
    yield _Lines(b"", 0), 0, pending


def _reject_rows(rows: list[dict] | pa.Table, source_id: str, uri: str, fmt: str, now: float) -> pa.Table:
    table = rows if isinstance(rows, pa.Table) else _rows_table(rows)
    n = table.num_rows
    if n == 0:
        return table_schema("rejects").arrow_schema().empty_table()
    return pa.table(
        {
            "source_id": pa.array([source_id] * n, pa.string()),
            "uri": pa.array([uri] * n, pa.string()),
            "line_number": table["line_number"].cast(pa.int64()),
            "format": pa.array([fmt] * n, pa.string()),
            "reason": table["reason"].cast(pa.string()),
            "raw": table["raw"].cast(pa.string()),
            "ingested_at": pa.array([now] * n, pa.float64()),
        }
    )


class _Progress:
    """A one-line bar on stderr, redrawn at most ten times a second; silent when off."""

    def __init__(self, enabled: bool, total_bytes: int) -> None:
        self.enabled = enabled
        self.total = max(total_bytes, 1)
        self.started = time.monotonic()
        self.drawn = 0.0

    def update(self, summary: IngestSummary, done_bytes: int, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self.drawn < 0.1):
            return
        self.drawn = now
        share = min(done_bytes / self.total, 1.0)
        bar = "#" * int(share * 30)
        rate = done_bytes / 1e6 / max(now - self.started, 1e-9)
        print(
            f"\r[{bar:<30}] {share * 100:5.1f}%  {done_bytes / 1e6:,.0f}/{self.total / 1e6:,.0f} MB  "
            f"{rate:,.0f} MB/s  {summary.objects_read} objects",
            end="",
            file=sys.stderr,
            flush=True,
        )

    def close(self) -> None:
        if self.enabled:
            print(file=sys.stderr)


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


class _Ingest:
    """One run: the store, the open batch, the summary."""

    def __init__(self, store: Store, options: IngestOptions) -> None:
        self.store = store
        self.options = options
        self._con: duckdb.DuckDBPyConnection | None = None
        self.batch = _Batch()
        self.summary = IngestSummary()
        self.previous = _previous_reads(store)
        self.seen: set[str] = set()  # uris of this run's listing
        self.errored_folders: list[str] = []  # folders the listing could not read
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hybridtrace-commit")
        self.progress = _Progress(False, 0)
        self.done_bytes = 0  # bytes of objects walked so far, for the progress bar
        self.pending: Future | None = None

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """The run's DuckDB connection, opened when a parser first needs it."""
        if self._con is None:
            import duckdb

            self._con = duckdb.connect(":memory:")
        return self._con

    def maybe_commit(self, force: bool = False) -> None:
        if self.batch.sources and (
            force or self.batch.rows >= BATCH_ROWS or len(self.batch.sources) >= BATCH_OBJECTS
        ):
            # Batches commit in order on one writer thread while the next one is parsed;
            # waiting for the previous commit first keeps at most two batches in memory,
            # and lets each commit's duplicate check see the batch before it.
            self.wait()
            self.pending = self.writer.submit(_commit, self.store, self.batch, self.summary)
            self.batch = _Batch()

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
        from hybridtrace.model import geometry_from_config, load_config

        config, name = load_config(source)
        geometry_from_config(config, name)  # refuse a config we cannot size, now
        text = json.dumps(config, sort_keys=True)
        uri = f"model:{hashlib.sha256(text.encode()).hexdigest()[:16]}"
        # Named per run, so choosing a config used before makes it the latest choice again.
        row = self._source_row(uri, len(text), time.time(), "", 0, 1, "model_config")
        row.update(end_offset=len(text), rows=json.dumps({"models": 1}))
        self.batch.sources.append(row)
        # its origin is this run's choice: choosing a config again makes it the latest choice
        table = pa.table({"model": [name], "architecture": [(config.get("architectures") or [None])[0]],
                          "config": [text], "applies_to": ["*"], "origin": [row["source_id"]],
                          "ingested_at": [time.time()], "source_id": [row["source_id"]],
                          "line_number": [1]})  # fmt: skip
        self.batch.add("models", table)

    def error(self, row: dict, message: str) -> None:
        """Mark an object's manifest row as unreadable, and count it for the summary."""
        row.update(status="error", message=message)
        self.summary.errors += 1
        if len(self.summary.error_messages) < ERROR_MESSAGES:
            self.summary.error_messages.append(f"{redact(row['uri'])}: {message}")

    def left_out(self, obj: ObjectRef) -> None:
        """A manifest row for an object the listing says not to open, once: a later run that
        lists it as it was finds it unchanged, so the manifest does not grow run after run."""
        last = self.previous.get(obj.uri)
        if last is not None and last["status"] == "skipped" and self.listed_unchanged(obj):
            self.summary.objects_skipped += 1
            return
        row = self._source_row(obj.uri, obj.size, obj.mtime, "", 0, 1, "unknown")
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

    def object(self, obj: ObjectRef, fetched: tuple[bytes, str | None] | None = None) -> None:
        """Read one object (``fetched``: its bytes and version, already downloaded)."""
        summary = self.summary
        summary.objects_seen += 1
        uri, size, mtime = obj.uri, obj.size, obj.mtime
        self.seen.add(uri)
        if obj.error is not None:  # the listing could not read it (an unreadable folder)
            if obj.local is not None and obj.local.is_dir():
                self.errored_folders.append(uri)
            self.batch.sources.append(self._source_row(uri, size, mtime, "", 0, 1, "unknown"))
            self.error(self.batch.sources[-1], obj.error)
            return
        if obj.skipped is not None:
            self.left_out(obj)
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
            self.batch.sources.append(self._source_row(uri, size, mtime, "", 0, 1, "unknown"))
            self.error(self.batch.sources[-1], f"cannot read: {redact(exc.strerror or str(exc))}")
            return
        if unchanged and version is not None and version == last["version"]:
            raw.close()
            # rewritten with the same content (same ETag): note the new time, so the next
            # listing alone says unchanged
            row = {**last, "source_id": _source_id(uri, size, mtime, last["start_offset"] or 0),
                   "batch_id": self.batch.id, "mtime": mtime, "rows": "{}", "lines": 0, "rejects": 0,
                   "duplicates": 0, "ingested_at": time.time(),
                   "message": "rewritten, same version"}  # fmt: skip
            self.batch.sources.append(row)
            summary.objects_skipped += 1
            self.done_bytes += size
            return
        compressed = head[:2] == b"\x1f\x8b"
        fingerprint = _fingerprint(head[:size])
        if not compressed and looks_like_ring(head, size):
            self._ring(obj, raw, head, fingerprint, version)
            return
        start, first_line, fmt, engine_id, resume_ts = 0, 1, None, None, None
        # A read that found nothing it knows (a launcher banner before the first vLLM line)
        # is not resumed: the whole object is looked at again.
        # A scrape or a config is one whole: when it changes it is read again from the start.
        resumable = last and last["format"] not in WHOLE_FORMATS
        if resumable and last["end_offset"]:
            same_object = last["size_bytes"] == size and last["mtime"] == mtime
            grown = (
                not compressed
                and last["size_bytes"] is not None
                and size > last["end_offset"]
                and _fingerprint(head[: last["size_bytes"]]) == last["etag"]
            )
            if (same_object and last["status"] == "partial") or grown:
                start, first_line = last["end_offset"], last["end_line"] + 1
                fmt, engine_id, resume_ts = last["format"], last["engine_id"], last.get("end_ts")
        try:
            if start and not compressed:
                start = _after_counted_line(raw, start)
            handle = _from(raw, start, compressed)
        except (OSError, EOFError, zlib.error) as exc:
            raw.close()
            self.batch.sources.append(
                self._source_row(uri, size, mtime, fingerprint, start, first_line, "unknown", version)
            )
            self.error(self.batch.sources[-1], f"cannot read: {redact(str(exc))}")
            return
        reader = _ObjectReader(self, obj, fingerprint, version, compressed, fmt, engine_id)
        reader.resume_ts = resume_ts
        try:
            with handle:
                summary.objects_read += 1
                reader.run(handle, start, first_line)
        except (OSError, EOFError, zlib.error) as exc:
            # a corrupt or truncated object (a cut .gz, a read that failed half-way): what was
            # read stays, the object is marked, and the run goes on; the next run tries again
            self.error(reader.fail(), f"cannot read: {redact(str(exc)) or type(exc).__name__}")
        self.done_bytes += size
        self.progress.update(summary, self.done_bytes)
        self.maybe_commit()

    def _ring(
        self, obj: ObjectRef, raw: BinaryIO, head: bytes, fingerprint: str, version: str | None
    ) -> None:
        """A NIXL telemetry ring: read whole, as one snapshot (NIXL rewrites it in place).

        A later read is a new snapshot; its transfers that an earlier one held have the
        same key (agent, slot and content), so they are counted as duplicates, not
        stored twice. The file is only read.
        """
        row = self._source_row(obj.uri, obj.size, obj.mtime, fingerprint, 0, 1, "nixl_ring", version)
        self.batch.sources.append(row)
        self.summary.objects_read += 1
        self.summary.by_format["nixl_ring"] = self.summary.by_format.get("nixl_ring", 0) + 1
        try:
            with raw:
                data = head + raw.read()
            ring = parse_ring(data, obj.name)
        except (OSError, RingError) as exc:
            self.error(row, f"cannot read the NIXL ring: {redact(str(exc))}")
            return
        transfers, snapshot = ring_tables(ring, row["source_id"], time.time())
        counts = {}
        for name, table in (("nixl_transfers", transfers), ("nixl_rings", snapshot)):
            if table.num_rows:
                self.batch.add(name, table)
                counts[name] = table.num_rows
        row.update(rows=json.dumps(counts), end_offset=obj.size, end_line=ring.events, lines=ring.events)
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
            row = self._source_row(uri, None, None, last["etag"], last["end_offset"] or 0,
                                   (last["end_line"] or 0) + 1, last["format"], last["version"])  # fmt: skip
            # its own id: an object can go, come back and go again
            row.update(status="deleted", message="gone from its listing; the rows read from it stay",
                       engine_id=last["engine_id"],
                       source_id=_source_id(uri, -1, row["ingested_at"], row["start_offset"]))  # fmt: skip
            self.batch.sources.append(row)
            self.summary.objects_gone += 1

    def _source_row(self, uri, size, mtime, fingerprint, start, first_line, fmt, version=None) -> dict:
        return {
            "source_id": _source_id(uri, size, mtime, start),
            "batch_id": self.batch.id,
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
            "ingested_at": time.time(),
            "schema_version": SCHEMA_VERSION,
        }


class _ObjectReader:
    """Streams one object through its format's parser, committing slices as batches fill."""

    def __init__(self, run: _Ingest, obj: ObjectRef, fingerprint: str, version: str | None,
                 compressed: bool, fmt: str | None, engine_id: str | None) -> None:  # fmt: skip
        self.job, self.obj, self.uri = run, obj, obj.uri
        self.size, self.mtime, self.fingerprint = obj.size, obj.mtime, fingerprint
        self.compressed = compressed
        self.version = version
        self.fmt = fmt
        self.engine_id = engine_id
        self.row: dict | None = None  # the manifest row of the slice being read
        self.resume_ts: float | None = None  # a resumed log's latest stamp so far
        self.log_ctx: vllm_log.LogContext | None = None
        self.cut_record = False  # the last record was cut short for good: a reject, not held back
        self.whole: list[bytes] = []  # the chunks of an object parsed whole (another engine's files)

    def fail(self) -> dict:
        """Close the read's open manifest row (or add one) for the run to mark as an error."""
        row = self.row
        if row is None or "counts" not in row:
            row = self._new_row(self.row["end_offset"] if self.row else 0, 1)
        self._close_row(row)
        row["format"] = self.fmt or "unknown"
        return row

    def run(self, handle: BinaryIO, start: int, first_line: int) -> None:
        offset, line = start, first_line
        row = self._new_row(offset, line)
        # a bucket object is whole once uploaded: no line of it is still being written
        quiet = self.compressed or self.obj.local is None or (time.time() - self.mtime) > QUIET_SECONDS
        for lines, consumed, tail in _line_chunks(handle):
            final = not lines and not consumed
            if self.fmt is None:
                from hybridtrace.ingest.detect import detect_format

                head = lines.block[:HEAD_BYTES] if lines else tail[:HEAD_BYTES]
                self.fmt = detect_format(head, self.obj.name) if head.strip() else "empty"
                row["format"] = self.fmt
                self.job.summary.by_format[self.fmt] = self.job.summary.by_format.get(self.fmt, 0) + 1
            if final:
                lines, consumed = self._last_line(row, tail, line, quiet)
            self.job.summary.bytes_read += consumed
            self.job.progress.update(
                self.job.summary, self.job.done_bytes + min(offset + consumed, self.size)
            )
            kept_back = self._parse(row, lines, line, final)
            line += len(lines)
            offset += consumed
            row["end_offset"] = offset - kept_back[0]
            row["end_line"] = line - 1 - kept_back[1]
            row["lines"] = row["end_line"] - (row["start_line"] - 1)
            if not final and self.job.batch.rows >= BATCH_ROWS:
                # Commit what is parsed so far as a slice; the rest is a continued read.
                row["status"] = "partial"
                self._close_row(row)
                self.job.maybe_commit(force=True)
                row = self._new_row(row["end_offset"], row["end_line"] + 1)
        if self.fmt in (None, "empty"):
            row.update(status="empty", format="empty")
        elif self.fmt == "unknown":
            row.update(status="unrecognised")
        elif not self.compressed and row["end_offset"] < self.size and not self.cut_record:
            # a last line still being written was held back: the next run reads it, even if
            # the object has not changed by then
            row["status"] = "partial"
        self._close_row(row)

    def _last_line(self, row: dict, tail: bytes, number: int, quiet: bool) -> tuple[_Lines, int]:
        """What to parse of an object's last line when no newline ends it: (lines, bytes taken).

        ``quiet``: the object can no longer grow (a bucket object, a gzip, a local file
        untouched for QUIET_SECONDS), so nothing more of the line will come.
        """
        if not tail.strip():
            return _Lines(b"", 0), len(tail)  # trailing blanks
        if self.fmt == "connector_trace":
            if _is_json(tail):  # a record is whole when it parses, whatever the object's age
                return _Lines(tail, 1), len(tail)
            if quiet:
                # Cut short for good: a reject, once. The read stops before the line, so an
                # object that grows after all has it read whole, and then the store's rejects
                # view drops this one (see store.CUT_RECORD): never a fragment, never twice.
                from hybridtrace.ingest.vllm_log import RAW_LIMIT

                raw = tail[:RAW_LIMIT].decode("utf-8", "backslashreplace")
                self._reject(row, [{"line_number": number, "reason": CUT_RECORD, "raw": raw}])
                self.cut_record = True
            return _Lines(b"", 0), 0  # a record still being written waits for its end
        if quiet or self.fmt == "model_config":
            return _Lines(tail, 1), len(tail)
        return _Lines(b"", 0), 0  # a line still being written: read by a later run

    def _new_row(self, offset: int, line: int) -> dict:
        row = self.job._source_row(
            self.uri, self.size, self.mtime, self.fingerprint, offset, line, self.fmt, self.version
        )
        row["start_line"] = line
        row["counts"] = {}
        row["engine_id"] = self.engine_id
        self.job.batch.sources.append(row)
        self.row = row
        return row

    def _close_row(self, row: dict) -> None:
        if "counts" not in row:
            return  # closed already
        if self.log_ctx is not None:
            row["end_ts"] = self.log_ctx.latest_ts if self.log_ctx.latest_ts is not None else self.resume_ts
        row["rows"] = json.dumps(row.pop("counts"))
        row.pop("start_line", None)
        row["batch_id"] = self.job.batch.id

    def _add(self, row: dict, table: str, data: pa.Table) -> None:
        if data.num_rows:
            row["counts"][table] = row["counts"].get(table, 0) + data.num_rows
            self.job.batch.add(table, data)

    def _reject(self, row: dict, rejects: list[dict] | pa.Table) -> None:
        table = _reject_rows(rejects, row["source_id"], self.uri, self.fmt or "unknown", time.time())
        row["rejects"] += table.num_rows
        self.job.summary.rejects += table.num_rows
        self.job.batch.add("rejects", table)

    def _parse(self, row: dict, lines: _Lines, first_line: int, final: bool) -> tuple[int, int]:
        """Parse ``lines``; returns (bytes, lines) held back for the next chunk."""
        if self.fmt == "connector_trace":
            from hybridtrace.ingest.trace import fast_parse, parse_trace

            if lines and first_line == 1 and lines.block.startswith(b"\xef\xbb\xbf"):
                # a UTF-8 byte-order mark some editors and Windows tools put first
                lines = _Lines(lines.block[3:], len(lines))
            if lines:
                tables = fast_parse(lines.block, first_line, len(lines), row["source_id"])
                if tables is None:  # some line is not clean: the careful path says which
                    tables, rejects = parse_trace(self.job.con, lines.split(), first_line, row["source_id"])
                    self._reject(row, rejects)
                for name, table in tables.items():
                    self._add(row, name, table)
            return 0, 0
        if self.fmt == "vllm_log":
            return self._parse_log(row, lines, first_line, final)
        if self.fmt == "model_config":
            self._model_config(row, lines, final)
        if self.fmt in ("trtllm_csv", "sglang"):
            self._other_engine(row, lines, final)
        if self.fmt == "prometheus" and lines:
            self._prometheus(row, lines, first_line)
        return 0, 0

    def _prometheus(self, row: dict, lines: _Lines, first_line: int) -> None:
        from hybridtrace.ingest import prometheus

        texts, bad = _decode_lines(lines, first_line)
        samples, rejects = prometheus.parse_snapshot(texts, first_line, self.obj.name, self.mtime)
        self._reject(row, bad + rejects)
        if samples:
            instance = self.uri.rsplit("/", 1)[0]  # the folder's path: see _instance_engines
            table = _rows_table([{**s, "instance": instance, "source_id": row["source_id"]} for s in samples])
            self._add(row, "prom_samples", _with_day(table, "ts"))

    def _parse_log(self, row: dict, lines: _Lines, first_line: int, final: bool) -> tuple[int, int]:
        from hybridtrace.ingest import vllm_log

        if self.log_ctx is None:
            self.log_ctx = vllm_log.LogContext(
                uri=self.uri,
                mtime=self.mtime,
                year=self.job.options.year,
                tz=self.job.options.tz,
                engine_id=self.engine_id,
                fallback_engine_id=_folder_engine_id(self.obj),
            )
            if first_line > 1 and self.obj.local is not None:
                # a read resumed mid-file decides the TTY shape as the first read did, from
                # the file's head, not from the few lines appended since
                self.log_ctx.tty = _tty_shape(self.obj.local)
            self.log_ctx.resume_ts = self.resume_ts
        series, bad = _decode_series(lines, first_line)
        if bad:
            self._reject(row, bad)
        result = vllm_log.LogResult()
        vllm_log.parse_chunk(self.log_ctx, vllm_log.lines_frame(first_line, series), final, result)
        engine_id = vllm_log.finish(self.log_ctx, result)
        if result.engine.get("engine_id"):
            self.engine_id = self.log_ctx.engine_id = result.engine["engine_id"]
        row["engine_id"] = engine_id
        self._log_rows(row, result, engine_id)
        carried = self.log_ctx.carry
        return sum(len(t.encode()) + 1 for _, t in carried), len(carried)

    def _log_rows(self, row: dict, result: vllm_log.LogResult, engine_id: str) -> None:
        from hybridtrace.ingest import vllm_log

        sid = row["source_id"]
        events = _event_table(result)
        if events is not None:
            # The hash names the event by what the log says, not by where it was read, so
            # the same line in a rotated copy is a duplicate.
            digest = "md5(concat_ws('|', process, level, stamp, message, request_id, kind))"
            hashed = self.job.con.sql(
                f"SELECT * EXCLUDE (stamp), {digest} AS event_hash FROM events"
            ).to_arrow_table()
            hashed = hashed.append_column("engine_id", pa.array([engine_id] * hashed.num_rows, pa.string()))
            hashed = hashed.append_column("source_id", pa.array([sid] * hashed.num_rows, pa.string()))
            self._add(row, "log_events", _with_day(hashed, "ts"))
        if result.intervals:
            table = _rows_table(vllm_log.intervals_with_starts(self.log_ctx, result.intervals))
            n = table.num_rows
            for name, value in (("engine_id", engine_id), ("source_kind", "log"), ("source_id", sid)):
                table = table.append_column(name, pa.array([value] * n, pa.string()))
            self._add(row, "intervals", _with_day(table, "end_ts"))
        facts = {k: v for k, v in result.engine.items() if k != "engine_id"}
        if facts:
            first_ts = next((e["ts"] for e in result.events if e["ts"] is not None), None)
            if first_ts is None and events is not None and events.num_rows:
                first_ts = pc.min(events["ts"]).as_py()
            facts.setdefault("ts", first_ts)
            engine = {
                **facts,
                "engine_id": engine_id,
                "source_kind": "log",
                "source_id": sid,
                "line_number": 0,
            }
            self._add(row, "engines", _with_day(pa.Table.from_pylist([engine]), "ts"))
        self._reject(row, result.rejects)

    def _other_engine(self, row: dict, lines: _Lines, final: bool) -> None:
        """TensorRT-LLM's transfer CSVs and SGLang's request stats: parsed whole, at the end."""
        if lines:
            self.whole.append(lines.block)
        if not final:
            return
        data = b"\n".join(self.whole) + b"\n"
        if self.fmt == "trtllm_csv":
            from hybridtrace.ingest.trtllm import parse_trtllm

            tables, rejects = parse_trtllm(data, row["source_id"], name=self.uri, tz=self.job.options.tz)
        else:
            from hybridtrace.ingest.sglang import parse_sglang

            tables, rejects = parse_sglang(data, row["source_id"], name=self.uri, year=self.job.options.year,
                                           tz=self.job.options.tz, scrape_ts=self.mtime)
        for name, table in tables.items():
            self._add(row, name, table)
        if rejects:
            self._reject(row, [{"line_number": n, "reason": why, "raw": raw} for n, why, raw in rejects])

    def _model_config(self, row: dict, lines: _Lines, final: bool) -> None:
        # A config is small: collect its chunks and parse it once, at the end.
        if lines:
            self._config_bytes = getattr(self, "_config_bytes", b"") + lines.block + b"\n"
        if not final:
            return
        config, text, why = _read_config(getattr(self, "_config_bytes", b""))
        if config is None:
            # an object that cannot be read: its row says why, and the run exits 2 (docs/ingest.md)
            reject = {"line_number": 0, "reason": f"config.json unreadable: {why}", "raw": ""}
            self._reject(row, [reject])
            self.job.error(row, why)
            return
        name = config.get("_name_or_path") or (
            self.obj.folder if self.obj.name == "config.json" else self.obj.stem
        )
        table = pa.table(
            {
                "model": [str(name)],
                "architecture": [_architecture(config)],
                "config": [text],
                "origin": [self.uri],  # the same object read again is a duplicate, not a second row
                "ingested_at": [time.time()],
                "source_id": [row["source_id"]],
                "line_number": [1],
            }
        )
        self._add(row, "models", table)


def _read_config(data: bytes) -> tuple[dict | None, str, str]:
    """(config, its JSON text, "") from a config.json's bytes, or (None, "", why not)."""
    try:
        config = json.loads(data)
        text = json.dumps(config)
    except RecursionError:
        # Python's parser recurses per level: a config nested this deep is no model config
        return None, "", "nested too deeply to parse"
    except (ValueError, UnicodeDecodeError) as exc:
        return None, "", str(exc)
    if not isinstance(config, dict):
        return None, "", "not a JSON object"
    return config, text, ""


def _architecture(config: dict) -> str | None:
    """The config's first architecture (or its model_type), when it is text."""
    listed = config.get("architectures")
    first = listed[0] if isinstance(listed, list) and listed else config.get("model_type")
    return first if isinstance(first, str) else None


def _is_json(data: bytes) -> bool:
    """Whether ``data`` parses as JSON: whether a trace's last record is whole."""
    try:
        json.loads(data)
    except RecursionError:
        # nested deeper than Python's parser goes: whole or not, no check here can tell, so
        # it is read as it is and the trace parser says what is wrong with it
        return True
    except (ValueError, UnicodeDecodeError):
        return False
    return True


def _event_columns() -> dict:
    import polars as pl

    return {
        "ts": pl.Float64,
        "process": pl.String,
        "rank": pl.Int32,
        "level": pl.String,
        "line_number": pl.Int64,
        "kind": pl.String,
        "message": pl.String,
        "stamp": pl.String,
        "request_id": pl.String,
        "remote_engine_id": pl.String,
        "details": pl.String,
    }


def _event_table(result: vllm_log.LogResult) -> pa.Table | None:
    import polars as pl

    columns = _event_columns()
    frames = [f.select(list(columns)).cast(columns) for f in result.event_frames]
    if result.events:
        frames.append(pl.DataFrame(result.events, schema=columns))
    if not frames:
        return None
    return pl.concat(frames).to_arrow()


def _tty_shape(path: Path) -> bool | None:
    """Whether the log's lines all end with a carriage return (written through a TTY), from
    its first lines; None when there are too few to say."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(HEAD_BYTES)
    except OSError:
        return None
    lines = [line for line in head.split(b"\n")[:-1] if line]
    if len(lines) < 2:
        return None
    return all(line.endswith(b"\r") for line in lines)


def _decode_series(lines: _Lines, first_line: int) -> tuple[pl.Series, list[dict]]:
    """Lines as a polars Series, split without a Python list when the block is valid UTF-8."""
    import polars as pl

    if not lines:
        return pl.Series("raw", [], dtype=pl.String), []
    block = lines.block
    # polars' CSV reader splits and checks UTF-8 on every core, several times faster than
    # decoding and splitting here; it would also take "\r" for part of a line end, a BOM
    # for no text and the separator for a second field, so those blocks go the long way
    if b"\r" not in block and b"\x1f" not in block and not block.startswith(b"\xef\xbb\xbf"):
        try:
            frame = pl.read_csv(block, has_header=False, separator="\x1f", quote_char=None,
                                new_columns=["raw"], schema={"raw": pl.String})  # fmt: skip
        except pl.exceptions.ComputeError:  # invalid UTF-8: said line by line below
            frame = None
        if frame is not None and frame.height == len(lines):  # a blank last line is dropped
            return frame["raw"].fill_null(""), []
    try:
        text = lines.block.decode("utf-8")
    except UnicodeDecodeError:
        texts, bad = _decode_lines(lines, first_line)
        return pl.Series("raw", texts, dtype=pl.String), bad
    return pl.Series("raw", [text]).str.split("\n").explode(), []


def _decode_lines(lines: _Lines, first_line: int) -> tuple[list[str], list[dict]]:
    """Text of each line; undecodable lines become rejects and empty text (numbering kept)."""
    from hybridtrace.ingest.vllm_log import RAW_LIMIT

    if not lines:
        return [], []
    try:
        return lines.block.decode("utf-8").split("\n"), []
    except UnicodeDecodeError:
        texts, bad = [], []
        for i, raw in enumerate(lines.split()):
            try:
                texts.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                texts.append("")
                bad.append({"line_number": first_line + i, "reason": "invalid UTF-8",
                            "raw": raw[:RAW_LIMIT].decode("utf-8", "backslashreplace")})  # fmt: skip
        return texts, bad


def _folder_engine_id(obj: ObjectRef) -> str:
    """Without a NIXL engine id in the log, the instance is named by its folder."""
    return obj.folder or obj.stem


def _rows_table(rows: list[dict]) -> pa.Table:
    """Rows as a table with every key any row has (``from_pylist`` takes the first row's)."""
    if rows and all(row.keys() == rows[0].keys() for row in rows):
        return pa.Table.from_pylist(rows)  # the usual case, without a copy of every row
    keys = dict.fromkeys(key for row in rows for key in row)
    return pa.Table.from_pylist([{key: row.get(key) for key in keys} for row in rows])


def _with_day(table: pa.Table, ts_column: str) -> pa.Table:
    ts = table[ts_column].cast(pa.float64())
    millis = pc.cast(pc.multiply(ts, 1000.0), pa.int64(), safe=False)
    day = pc.cast(pc.cast(millis, pa.timestamp("ms", tz="UTC")), pa.date32())
    return table.append_column("day", day) if "day" not in table.column_names else table


def ingest(
    paths: Iterable[str | Path],
    store_root: str | Path,
    *,
    progress: bool = False,
    year: int | None = None,
    tz: str = "UTC",
    model: str | None = None,
) -> IngestSummary:
    """Ingest every object under ``paths`` into the store at ``store_root``.

    ``model`` (a config.json path or built-in name) is the config every engine serves,
    whatever the engines call their model.
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
        run.progress = _Progress(progress, sum(o.size for o in objects))
        try:
            for obj, fetched in _prefetch(objects, run.may_be_unchanged):
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


def _previous_reads(store: Store) -> dict[str, dict]:
    """The latest read of each object, by uri."""
    latest: dict[str, dict] = {}
    for row in store.sources_frame().to_pylist():
        if row["status"] == "error":
            continue
        current = latest.get(row["uri"])
        if current is None or (row["ingested_at"], row["end_offset"] or 0) >= (
            current["ingested_at"],
            current["end_offset"] or 0,
        ):
            latest[row["uri"]] = row
    return latest


def _commit(store: Store, batch: _Batch, summary: IngestSummary) -> None:
    """Dedupe and write one batch (on the writer thread)."""
    tables: dict[str, pa.Table] = {}
    duplicates_by_source: dict[str, int] = {}
    lost_rows: dict[tuple[str, str], int] = {}  # (source, table) → rows dropped as duplicates
    for name, parts in batch.tables.items():
        data = concat(parts, table_schema(name))
        if name in DEDUPED and data.num_rows:
            kept, dropped = dedupe(store, name, data)
            if dropped:
                kept_map = {d["values"]: d["counts"] for d in pc.value_counts(kept["source_id"]).to_pylist()}
                for item in pc.value_counts(data["source_id"]).to_pylist():
                    lost = item["counts"] - kept_map.get(item["values"], 0)
                    if lost:
                        duplicates_by_source[item["values"]] = (
                            duplicates_by_source.get(item["values"], 0) + lost
                        )
                        lost_rows[(item["values"], name)] = lost
            data = kept
            summary.duplicates += dropped
        tables[name] = data
        summary.rows[name] = summary.rows.get(name, 0) + data.num_rows
    for row in batch.sources:
        row["duplicates"] = duplicates_by_source.get(row["source_id"], 0)
        if row["duplicates"] and row.get("rows"):
            # `rows` counts what the object added to the store: its duplicates are not written
            counts = json.loads(row["rows"])
            for table in counts:
                counts[table] -= lost_rows.get((row["source_id"], table), 0)
            row["rows"] = json.dumps(counts)
    sources = pa.Table.from_pylist(batch.sources, schema=table_schema("sources").arrow_schema())
    store.write_batch(batch.id, tables, sources)
