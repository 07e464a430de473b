"""The trace writer: the engine's thread enqueues, a background thread encodes and appends.

The hot path (:meth:`TraceWriter.emit`) appends one tuple to a deque: no JSON, no I/O, no
lock. A record is built from that tuple only on the writer's thread, so the engine pays
for neither the dict nor the encoding. The queue is bounded; what does not fit is counted
and the count is written as a ``dropped`` record, so a reader knows how complete the trace
is. Files are append-only parts named by engine, role, rank and pid; a part that reaches
its size bound is closed and never touched again, so an incremental ingest reads each
part once. Every error on the writer's side is logged once and swallowed.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hybridtrace.connector.records import dropped_record

try:  # optional: about 5x faster encoding than the standard library
    import orjson

    _NEWLINE = orjson.OPT_APPEND_NEWLINE

    def _encode(record: dict) -> bytes:
        return orjson.dumps(record, option=_NEWLINE)

except ImportError:  # pragma: no cover - depends on the host's packages
    import json

    def _encode(record: dict) -> bytes:
        return (json.dumps(record, separators=(",", ":")) + "\n").encode()


log = logging.getLogger("hybridtrace.connector")

TRACE_DIR_ENV = "HYBRIDTRACE_TRACE_DIR"
DEFAULT_PART_BYTES = 64 << 20
DEFAULT_QUEUE_RECORDS = 1 << 16

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
_said: set[str] = set()


def say_once(key: str, message: str, *args: object, level: int = logging.WARNING) -> None:
    """Log ``message`` the first time ``key`` is seen in this process, never again."""
    if key in _said:
        return
    _said.add(key)
    with contextlib.suppress(Exception):  # a broken logging setup must not reach the engine
        log.log(level, "hybridtrace: " + message, *args)


def trace_dir(extra_config: dict | None) -> str | None:
    """The folder to trace into: ``hybridtrace_dir`` in the connector's extra config, else
    ``$HYBRIDTRACE_TRACE_DIR``; None (trace nothing) when neither is set."""
    value = (extra_config or {}).get("hybridtrace_dir") or os.environ.get(TRACE_DIR_ENV)
    return str(value) if value else None


def part_name(engine_id: str, role: str, rank: int | None, pid: int, part: int) -> str:
    """``<engine>.<role>.tp<rank>.pid<pid>.<part>.jsonl`` (``sched`` for the scheduler, which
    has no TP rank); the engine id is made file-safe."""
    where = "sched" if rank is None else f"tp{rank}"
    return f"{_SAFE.sub('_', engine_id)[:120]}.{role}.{where}.pid{pid}.{part:04d}.jsonl"


Builder = Callable[..., dict | None]


class TraceWriter:
    """One process's trace: a bounded queue, a daemon thread, size-bounded parts.

    ``header`` records (the process's ``engine`` records) open every part, so any one
    part says which engine and layout its reads belong to.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        engine_id: str,
        role: str,
        rank: int | None,
        part_bytes: int = DEFAULT_PART_BYTES,
        queue_records: int = DEFAULT_QUEUE_RECORDS,
        flush_s: float = 0.2,
    ) -> None:
        self.directory = Path(directory)
        self.engine_id, self.role, self.rank = engine_id, role, rank
        self.pid = os.getpid()
        self.part_bytes = max(int(part_bytes), 4096)
        self.limit = max(int(queue_records), 1)
        self.flush_s = flush_s
        self.dropped = 0  # written by emitters only
        self.written = 0
        self.parts: list[Path] = []
        self._reported_drops = 0
        self._queue: deque[tuple] = deque()
        self._header: list[dict] = []
        self._file: Any = None
        self._size = 0
        self._part = 0
        self._broken = False
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hybridtrace-trace", daemon=True)
        self._thread.start()
        ref = weakref.ref(self)
        atexit.register(lambda: (w := ref()) is not None and w.close())

    # -- the engine's side -------------------------------------------------------------

    def emit(self, builder: Builder, *facts: object) -> None:
        """Queue one record, to be built as ``builder(*facts)`` on the writer's thread.

        ``facts`` must not be mutated afterwards (pass copies of lists the engine reuses).
        """
        queue = self._queue
        if len(queue) >= self.limit:
            self.dropped += 1
            return
        queue.append((builder, facts))

    def header(self, record: dict) -> None:
        """A record that opens every part (an ``engine`` record); written at once."""
        self._header.append(record)
        self._queue.append((_same, (record,)))
        self._wake.set()

    # -- the writer's side -------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._wake.wait(self.flush_s)
            self._wake.clear()
            stopping = self._stop.is_set()
            self._drain()
            if stopping:
                break
        self._close_file()

    def _drain(self) -> None:
        queue = self._queue
        while queue:
            chunk: list[bytes] = []
            # A chunk at a time, then the GIL goes back to the engine: a long drain must
            # not hold its thread for a whole switch interval (5 ms).
            for _ in range(min(len(queue), 512)):
                builder, facts = queue.popleft()
                try:
                    record = builder(*facts)
                    if record is None:
                        continue
                    chunk.append(_encode(record))
                except Exception as error:  # a bad record is lost, the trace goes on
                    name = getattr(builder, "__name__", "trace")
                    say_once(f"build:{name}", "a %s record could not be built (%s); such records are "
                             "skipped", name, error)
            if chunk:
                self._write(chunk)
            time.sleep(0)
        drops = self.dropped - self._reported_drops
        if drops:
            self._reported_drops += drops
            self._write([_encode(dropped_record(self.engine_id, self.rank, self.pid, drops))])
        if self._file is not None and not self._broken:
            try:
                self._file.flush()
            except OSError as error:
                self._fail(error)
        self._idle.set()

    def _write(self, lines: list[bytes]) -> None:
        if self._broken:
            return
        try:
            if self._file is None or self._size >= self.part_bytes:
                self._open_part()
            data = b"".join(lines)
            self._file.write(data)
            self._size += len(data)
            self.written += len(lines)
        except OSError as error:
            self._fail(error)

    def _open_part(self) -> None:
        self._close_file()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._part += 1
        path = self.directory / part_name(self.engine_id, self.role, self.rank, self.pid, self._part)
        self._file = open(path, "ab")  # noqa: SIM115 - held open across drains, closed by _close_file
        self._size = path.stat().st_size
        self.parts.append(path)
        if self._part > 1 and self._header:  # the first part gets them through the queue
            data = b"".join(_encode(record) for record in self._header)
            self._file.write(data)
            self._size += len(data)

    def _close_file(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError as error:
                self._fail(error)
            self._file = None

    def _fail(self, error: OSError) -> None:
        self._broken = True
        say_once("write", "cannot write the trace in %s (%s); tracing stops, the engine goes on",
                 self.directory, error, level=logging.ERROR)

    # -- both ------------------------------------------------------------------------------

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything queued so far is written; False on timeout."""
        self._idle.clear()
        self._wake.set()
        return self._idle.wait(timeout) and not self._queue

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, the drop count, and close the part. Safe to call twice."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._wake.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)


def _same(record: dict) -> dict:
    return record
