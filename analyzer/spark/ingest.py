"""The driver's side of ``ingest --engine spark``: objects parsed on executors, committed here.

The driver lists the inputs, recovers the store and decides what needs no reading exactly
as a local run does (``hybridtrace.ingest.run.ingest`` with ``read_objects``). The objects
left to read go out in waves, one Spark task per large object or per group of small ones
(``tasks.py``); their results are added, in listing order, to the run's batches as if
this process had read them, so the commit protocol, the dedupe against the store and the
manifest are a local run's.

What differs from a local ingest of the same inputs, by nature of a run:
``sources.batch_id``, ``sources.ingested_at`` and ``rejects.ingested_at`` (and the
``ingested_at`` of ``models`` and ``agent_map`` rows, a ring's ``read_at``), and the
``source_id`` of a manifest row noting an object gone (made of that time) — a local re-run
differs in them too.

An object is cut into slices where a local run's batch fills, which depends on the rows of
the objects before it in the batch: an executor cannot know that. So an executor cuts the
object after every chunk it reads, the only places a local run may cut, and the driver
joins those pieces into the manifest rows a local run writes: at each piece's end it cuts
(and commits) only when its own batch is full, as ``_ObjectReader.run`` does, and a piece
that goes on in the row before it has its rows' ``source_id`` made that row's.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING

from hybridtrace.buckets import ObjectRef, redact
from hybridtrace.errors import HybridtraceError
from hybridtrace.ingest.manifest import refused_unchanged
from hybridtrace.ingest.run import ERROR_MESSAGES, _Ingest
from hybridtrace.spark.session import SparkOptions, open_session
from hybridtrace.spark.tasks import ENGINE_PARSED, SUMMED, Result, Task, detach, read_partition, table_of

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

# A wave is what one Spark job reads; its results are held on the driver until merged, so
# it is bounded by objects and by input bytes (spark.driver.maxResultSize is 1 GiB by default).
WAVE_OBJECTS = 2048
WAVE_BYTES = int(os.environ.get("HYBRIDTRACE_SPARK_WAVE_BYTES", str(128 << 20)))
# A Spark task costs about a quarter of a second here, more than parsing a small object:
# small objects share a task, up to this much input, while every core still gets work.
TASK_BYTES = int(os.environ.get("HYBRIDTRACE_SPARK_TASK_BYTES", str(16 << 20)))
TASKS_PER_CORE = 2


class SparkReader:
    """``read_objects`` for ``ingest``: reads a run's objects on a Spark session's executors."""

    def __init__(self, options: SparkOptions | None = None, session: SparkSession | None = None) -> None:
        self.options = options or SparkOptions()
        self._session = session  # opened when the first object needs reading
        self.tasks = 0  # Spark tasks run
        self.objects = 0  # objects read on executors (for tests and the benchmark)

    @property
    def session(self) -> SparkSession:
        if self._session is None:
            self._session = open_session(self.options)
        return self._session

    def __call__(self, run: _Ingest, objects: list[ObjectRef]) -> None:
        for wave in self._waves(run, objects):
            self._read_wave(run, wave)

    @staticmethod
    def on_driver(run: _Ingest, obj: ObjectRef) -> bool:
        """True for an object the run settles without opening it (the listing says enough)."""
        return (
            obj.error is not None
            or obj.skipped is not None
            or refused_unchanged(run.failed.get(obj.uri), obj)
            or run.listed_unchanged(obj)
        )

    def _waves(self, run: _Ingest, objects: list[ObjectRef]) -> Iterator[list[ObjectRef]]:
        wave: list[ObjectRef] = []
        count = size = 0
        for obj in objects:
            wave.append(obj)
            if self.on_driver(run, obj):
                continue
            count, size = count + 1, size + obj.size
            if count >= WAVE_OBJECTS or size >= WAVE_BYTES:
                yield wave
                wave, count, size = [], 0, 0
        if wave:
            yield wave

    def _parallelism(self) -> int:
        try:
            return int(self.session.sparkContext.defaultParallelism)
        except Exception:  # Spark Connect has no SparkContext: its executors are not ours to count
            return int(self.session.conf.get("spark.default.parallelism", "8") or 8)

    def _read_wave(self, run: _Ingest, wave: list[ObjectRef]) -> None:
        tasks = [
            Task(
                i,
                detach(obj),
                run.previous.get(obj.uri),
                run.failed.get(obj.uri),
                run.options,
                run.chunk_bytes,
            )
            for i, obj in enumerate(wave)
            if not self.on_driver(run, obj)
        ]
        results = self._run(tasks)
        for i, obj in enumerate(wave):
            if i in results:
                merge(run, obj, results[i])
            else:
                run.object(obj)  # settled from the listing: nothing is opened

    def _run(self, tasks: list[Task]) -> dict[int, Result]:
        if not tasks:
            return {}
        groups = [[pickle.dumps(task) for task in group] for group in self._groups(tasks)]
        n = len(groups)
        # one partition per group: spark.range splits 0..n-1 evenly, so each task gets one id
        frame = self.session.range(0, n, 1, numPartitions=n).mapInArrow(
            partial(read_partition, groups), "index long, result binary"
        )
        try:
            rows = frame.collect()
        except Exception as exc:
            text = str(exc).strip().splitlines()
            raise HybridtraceError(f"the Spark job failed: {redact(text[0] if text else repr(exc))}") from exc
        self.tasks += n
        self.objects += len(tasks)
        return {row["index"]: pickle.loads(row["result"]) for row in rows}

    def _groups(self, tasks: list[Task]) -> list[list[Task]]:
        """The wave's objects in Spark tasks: one each when large, small ones together, at
        least ``TASKS_PER_CORE`` tasks per core when there are that many objects; the
        largest first, each to the task with the least input so far."""
        total = sum(task.obj.size for task in tasks)
        wanted = max(TASKS_PER_CORE * self._parallelism(), -(-total // TASK_BYTES))
        groups: list[list[Task]] = [[] for _ in range(min(len(tasks), wanted))]
        sizes = [0] * len(groups)
        for task in sorted(tasks, key=lambda t: -t.obj.size):
            emptiest = sizes.index(min(sizes))
            groups[emptiest].append(task)
            sizes[emptiest] += task.obj.size
        # within a task, in listing order (nothing depends on it; it reads as expected)
        return [sorted(group, key=lambda t: t.index) for group in groups]


def merge(run: _Ingest, obj: ObjectRef, result: Result) -> None:
    """Add an executor's read of ``obj`` to the run, as ``run.object(obj)`` would have."""
    if result.error is not None:
        raise pickle.loads(result.error)  # what a local run would have stopped with
    if result.error_text is not None:
        raise HybridtraceError(f"reading {redact(obj.uri)} failed on an executor:\n{result.error_text}")
    run.seen.add(obj.uri)
    summary, part = run.summary, result.summary
    for name in SUMMED:
        setattr(summary, name, getattr(summary, name) + getattr(part, name))
    for fmt, count in part.by_format.items():
        summary.by_format[fmt] = summary.by_format.get(fmt, 0) + count
    room = ERROR_MESSAGES - len(summary.error_messages)
    summary.error_messages.extend(part.error_messages[: max(0, room)])
    _add_pieces(run, obj, result)
    run.done_bytes += result.done_bytes
    run.progress.update(run.summary, run.done_bytes)
    if result.commit_after:
        run.maybe_commit()


def _add_pieces(run: _Ingest, obj: ObjectRef, result: Result) -> None:
    """Add an object's pieces to the run's batches as a local read would have: after each
    chunk, the object is cut (its manifest row closed, the batch committed) only when the
    batch is full; otherwise the next piece goes on in the same manifest row."""
    open_row: dict | None = None  # the manifest row a local read would still be reading into
    for piece in result.slices:
        tables = [(name, table_of(data)) for name, data in piece.tables]
        rows = list(piece.sources)
        if (open_row is not None or piece.cut) and len(rows) != 1:
            # a piece of a chunked read is one manifest row: anything else is a bug, not data
            raise HybridtraceError(f"reading {redact(obj.uri)}: a piece of {len(rows)} manifest rows")
        if open_row is not None:
            row = rows.pop()
            # the local read went on in the open row: its rows carry that row's id
            old, new = row["source_id"], open_row["source_id"]
            tables = [(name, _renamed(data, old, new)) for name, data in tables]
            join_row(open_row, row)
        elif piece.cut:
            open_row = rows.pop()
        for name, data in tables:
            run.batch.add(name, data)
        if piece.cut and not run.slice_due():
            continue  # the batch has room: the read goes on in the open row
        if open_row is not None:
            rows.insert(0, open_row)
            open_row = None
        for row in rows:
            row.pop(ENGINE_PARSED, None)
            row["batch_id"] = run.batch.id  # the batch this run commits it in
            run.batch.sources.append(row)
        if piece.cut:
            run.maybe_commit(force=True)  # a slice of a large object: its own batch


# Of a manifest row, what a later piece's row says last: where the read ended, what the
# format's parser last set (``envelope``, ``instances``), the format and the object's columns.
_KEPT_FROM_FIRST = {"source_id", "batch_id", "start_offset", "ingested_at", "duplicates"}
_JOINED = {"rows", "rejects", "lines", "status", "message", "engine_id", ENGINE_PARSED}


def join_row(row: dict, piece: dict) -> None:
    """Make ``row`` the manifest row a local read would have kept on through ``piece``, the
    next piece's row, read on from where ``row`` ends (``_ObjectReader.run`` and ``_parse``)."""
    counts = json.loads(row["rows"])
    for name, count in json.loads(piece["rows"]).items():
        counts[name] = counts.get(name, 0) + count  # first seen first, as the local counts are
    errored = row["message"] is not None  # only an error sets a read's message
    row["rows"] = json.dumps(counts)
    row["rejects"] += piece["rejects"]
    row["lines"] += piece["lines"]
    # a cut sets "partial" over an error; where no cut came, the error stands, unless the
    # read's end says more (empty, unrecognised, a last line held back)
    row["status"] = "error" if piece["status"] == "ok" and errored else piece["status"]
    if piece["message"] is not None:
        row["message"] = piece["message"]
    if piece.get(ENGINE_PARSED):
        row["engine_id"] = piece["engine_id"]  # else the row keeps the id it had
    for key, value in piece.items():
        if key not in _KEPT_FROM_FIRST and key not in _JOINED:
            row[key] = value


def _renamed(data: pa.Table, old: str, new: str) -> pa.Table:
    """``data`` with ``source_id`` ``new`` where it was ``old``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if "source_id" not in data.column_names or old == new:
        return data
    i = data.column_names.index("source_id")
    column = data.column(i)
    renamed = pc.if_else(pc.equal(column, old), pa.scalar(new, column.type), column)
    return data.set_column(i, data.field(i), renamed)
