"""What a Spark executor runs for ``ingest --engine spark``: one object, read as a local
ingest reads it, returned as plain bytes.

An executor needs the hybridtrace package and read access to the inputs, nothing else: it
never opens the store. The driver hands it an object as the listing saw it, with the
object's latest and failed manifest rows; the executor runs the same ``_Ingest.object``
(the same detection, resume point, format parser, rejects and manifest rows) into a batch
of its own, and returns that batch's tables as Arrow IPC streams, its manifest rows and
its summary counts. An object of more than one chunk returns one such batch per chunk,
cut where a local run may cut it (``Slice.cut``): only the driver knows where a local run
would have, since that depends on the rows of the objects before it in its batch, so the
driver joins the pieces into the slices a local run makes (``hybridtrace.spark.ingest``).
Everything here is picklable and imports PySpark nowhere: the same functions run under
a test without Spark.
"""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import pyarrow as pa

from hybridtrace.buckets import ObjectRef, bucket
from hybridtrace.ingest.batch import Batch
from hybridtrace.ingest.formats.base import Parsed
from hybridtrace.ingest.run import CHUNK_BYTES, IngestOptions, _Ingest, _ObjectReader
from hybridtrace.ingest.summary import IngestSummary

if TYPE_CHECKING:
    import duckdb

# The summary counts an executor's read adds to; rows and duplicates are counted by the
# driver's commit, which is where they are deduped.
SUMMED = ("objects_seen", "objects_read", "objects_skipped", "bytes_read", "rejects", "errors")
# A piece's manifest row says so when a parse in it set the row's engine id: a row joined
# from pieces takes the engine id of the last piece that set one (see spark.ingest.join_row).
ENGINE_PARSED = "_engine_parsed"


@dataclass
class Task:
    """One object to read, with what the driver's manifest says of it."""

    index: int  # its place in the listing: results are merged in this order
    obj: ObjectRef  # without its filesystem (the executor opens its own)
    last: dict | None  # its latest read (``previous_reads``), or None
    failed: dict | None  # its latest failed read, or None
    options: IngestOptions
    chunk_bytes: int = CHUNK_BYTES  # the driver's: pieces end where its local read's chunks would


@dataclass
class Slice:
    """One batch's worth of an object: its tables as Arrow IPC streams and manifest rows."""

    tables: list[tuple[str, bytes]] = field(default_factory=list)
    sources: list[dict] = field(default_factory=list)
    # it ends after a chunk, where a local run cuts when its batch is full: the driver
    # decides whether the next piece goes on in this piece's manifest row or in a new one
    cut: bool = False


@dataclass
class Result:
    """What an executor hands back for one object."""

    index: int
    slices: list[Slice] = field(default_factory=list)
    summary: IngestSummary = field(default_factory=IngestSummary)
    done_bytes: int = 0
    # the read asked for a commit when it ended (a local run's batch may fill there): the
    # driver asks at the same point, so its batches are cut where a local run's are
    commit_after: bool = False
    error: bytes | None = None  # the pickled exception a local ingest would have raised
    error_text: str | None = None  # its traceback, when it cannot be pickled


def detach(obj: ObjectRef) -> ObjectRef:
    """The object as a task carries it: a bucket filesystem is opened again where it is read,
    from that machine's own settings and credential chain, never shipped."""
    return replace(obj, filesystem=None)


_filesystems: dict[str, object] = {}  # per executor process: one filesystem per bucket


def attach(obj: ObjectRef) -> ObjectRef:
    """The object with a filesystem to read it through (a bucket's, opened once per process)."""
    if obj.local is not None or obj.path is None:
        return obj
    scheme, _, rest = obj.uri.partition("://")
    root = f"{scheme}://{rest.split('/', 1)[0]}"
    if root not in _filesystems:
        _filesystems[root] = bucket(root).filesystem
    return replace(obj, filesystem=_filesystems[root])


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def table_of(data: bytes) -> pa.Table:
    """A table back from ``_ipc``'s bytes."""
    return pa.ipc.open_stream(data).read_all()


def _slice_of(batch: Batch, cut: bool = False) -> Slice:
    tables = [(name, _ipc(part)) for name, parts in batch.tables.items() for part in parts]
    return Slice(tables, batch.sources, cut)


_shared: dict[str, duckdb.DuckDBPyConnection] = {}  # per executor process: the parsers' connection


class _PieceReader(_ObjectReader):
    """A local run's reader that notes, in each manifest row, whether a parse set its engine id."""

    def _took(self, row: dict, parsed: Parsed) -> None:
        if parsed.engine_id is not None:
            row[ENGINE_PARSED] = True


class _Detached(_Ingest):
    """A run over one object with no store: the object is cut after every chunk (each place
    a local run may cut it), and each piece kept as a slice, not committed."""

    def __init__(self, task: Task) -> None:
        uri = task.obj.uri
        reads = ({uri: task.last} if task.last else {}, {uri: task.failed} if task.failed else {})
        super().__init__(None, task.options, reads)
        self.slices: list[Slice] = []
        self.commit_after = False
        self.chunk_bytes = task.chunk_bytes

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        # One connection per executor process, as a local run has one for all its objects:
        # opening one per object would cost more than parsing a small one.
        if "con" not in _shared:
            import duckdb

            _shared["con"] = duckdb.connect(":memory:")
        return _shared["con"]

    def slice_due(self) -> bool:
        return True  # whether a local run would cut here is the driver's to say

    def new_reader(self, obj: ObjectRef, fingerprint: str, version: str | None, compressed: bool,
                   fmt: str | None, engine_id: str | None) -> _ObjectReader:  # fmt: skip
        return _PieceReader(self, obj, fingerprint, version, compressed, fmt, engine_id)

    def maybe_commit(self, force: bool = False) -> None:
        if not force:
            self.commit_after = True
            return
        # Forced only where the reader cuts an object after a chunk: the piece so far is one
        # slice, and the read goes on in the next (the driver joins or commits them in order).
        if self.batch.sources:
            self.slices.append(_slice_of(self.batch, cut=True))
            self.batch = Batch()

    def wait(self) -> None:
        pass  # nothing is committed here


def read_task(task: Task) -> Result:
    """Read one object as a local ingest would, into a ``Result``; never raises."""
    result = Result(task.index)
    run = None
    try:
        run = _Detached(task)
        run.object(attach(task.obj))
        if run.batch.sources:
            run.slices.append(_slice_of(run.batch))
        result.slices, result.summary, result.done_bytes = run.slices, run.summary, run.done_bytes
        result.commit_after = run.commit_after
    except Exception as exc:
        try:
            result.error = pickle.dumps(exc)
        except Exception:
            result.error_text = "".join(traceback.format_exception(exc))
    finally:
        if run is not None:
            run.writer.shutdown(wait=False)
    return result


RESULT_SCHEMA = pa.schema([("index", pa.int64()), ("result", pa.binary())])


def read_partition(groups: list[list[bytes]], batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``'s function: each id in the partition names a group of pickled
    ``Task``s in ``groups``, read in order; each task yields one row, its index in the
    wave and its pickled ``Result``."""
    for ids in batches:
        for group in ids.column(0).to_pylist():
            for payload in groups[group]:
                task = pickle.loads(payload)
                result = read_task(task)
                yield pa.RecordBatch.from_pydict(
                    {"index": [task.index], "result": [pickle.dumps(result)]}, schema=RESULT_SCHEMA
                )
