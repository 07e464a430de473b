"""Reading an object's bytes: gzip undone, a resumed read's start found, whole lines cut in chunks.

Every format reads through these, so an object is streamed in bounded chunks whatever
its size and whatever it holds; a format is given whole lines only (see ``formats.base``).
"""

from __future__ import annotations

import gzip
import os
import queue
import threading
import zlib
from collections.abc import Generator, Iterator
from typing import BinaryIO, TypeVar

T = TypeVar("T")

# A line longer than this is cut to it in a reject's `raw` column (as every parser cuts it).
RAW_LIMIT = 512


class Gunzip(gzip.GzipFile):
    """A gzip reader that also closes the handle it reads from."""

    def __init__(self, raw: BinaryIO) -> None:
        super().__init__(fileobj=raw, mode="rb")
        self._raw = raw
        self._cut: BaseException | None = None

    def read(self, size: int | None = -1) -> bytes:
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


def open_from(raw: BinaryIO, start: int, compressed: bool, chunk_bytes: int) -> BinaryIO:
    """The (decompressed) bytes of an open object from ``start``; closing it closes ``raw``."""
    raw.seek(0 if compressed else start)
    if not compressed:
        return raw
    handle: BinaryIO = Gunzip(raw)  # type: ignore[assignment]
    remaining = start
    while remaining:
        skipped = handle.read(min(remaining, chunk_bytes))
        if not skipped:
            break
        remaining -= len(skipped)
    return handle


def after_counted_line(handle: BinaryIO, offset: int) -> int:
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


# A block this large has its newlines counted by polars over a zero-copy view of its bytes,
# several bytes per instruction; bytes.count takes them one at a time (a 24 MiB chunk: about
# 2 ms against 9, on the thread that reads ahead while the parser holds the cores).
_VECTOR_COUNT_BYTES = 1 << 20


def count_newlines(data: bytes | bytearray, end: int) -> int:
    """How many newlines ``data[:end]`` holds."""
    if end < _VECTOR_COUNT_BYTES:
        return data.count(b"\n", 0, end)
    import polars as pl
    import pyarrow as pa

    view = pa.Array.from_buffers(pa.uint8(), end, [None, pa.py_buffer(data)])
    # a select, not a Series' own operators: polars runs it without holding the GIL
    return int(pl.DataFrame({"b": view}).select((pl.col("b") == ord("\n")).sum()).item())


class Lines:
    """A block of whole lines (no final newline): split only by parsers that need it."""

    __slots__ = ("_split", "block", "count")

    def __init__(self, block: bytes, count: int | None = None) -> None:
        self.block = block
        self.count = (count_newlines(block, len(block)) + 1 if block else 0) if count is None else count
        self._split: list[bytes] | None = None

    def __len__(self) -> int:
        return self.count

    def split(self) -> list[bytes]:
        if self._split is None:
            self._split = self.block.split(b"\n") if self.count else []
        return self._split


NO_LINES = Lines(b"", 0)


# How much of a chunk's end is read first to find its last newline (``_exact_chunks``).
_CUT_WINDOW = 1 << 16


def _exact_chunks(handle: BinaryIO, chunk_bytes: int) -> Generator[tuple[Lines, int, bytes], None, None]:
    """The chunks of a plain file while each is whole: its end read first to find the last
    newline, then its lines read in one system call into the bytes the parser gets.

    A read into a buffer and a copy of its lines out would be two copies, the second made
    holding the GIL that the parser's thread waits for. Stops, the handle at the first byte
    not taken, at the chunk the file ends in (or may still be growing in) and at a chunk
    whose end holds no newline; the caller cuts the rest.
    """
    try:
        fd = handle.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a file of the system's (an object in memory)
    if chunk_bytes <= _CUT_WINDOW:
        return
    position = handle.tell()
    try:
        while True:
            window_at = position + chunk_bytes - _CUT_WINDOW
            window = os.pread(fd, _CUT_WINDOW, window_at)
            cut = window.rfind(b"\n") if len(window) == _CUT_WINDOW else -1
            if cut < 0:
                return
            end = window_at + cut  # the last newline of the chunk
            block = os.pread(fd, end - position, position)
            if len(block) != end - position:
                return
            yield Lines(block, count_newlines(block, len(block)) + 1), end + 1 - position, b""
            position = end + 1
    finally:
        handle.seek(position)


def _seekable_line_chunks(handle: BinaryIO, chunk_bytes: int) -> Iterator[tuple[Lines, int, bytes]]:
    """As line_chunks, for a plain file: seek back over the partial last line instead of
    carrying it, which saves a copy of every chunk.

    After a first full chunk, the file is read into one buffer kept for the object: each
    chunk's lines are then the one copy made of it, where a fresh read and its cut would be
    two, each a new mapping of fresh memory the system must fault in. A file's whole chunks
    come first from ``_exact_chunks``, with one copy and none made holding the GIL.
    """
    yield from _exact_chunks(handle, chunk_bytes)
    data: bytes | bytearray = handle.read(chunk_bytes)
    size = len(data)  # of what the last read put in ``data``
    buffer: bytearray | None = None
    while True:
        if not size:
            yield Lines(b"", 0), 0, b""
            return
        cut = data.rfind(b"\n", 0, size)
        if cut < 0 or size < chunk_bytes:
            break  # one long line, or the end of the file: finish the simple way
        handle.seek(cut + 1 - size, os.SEEK_CUR)
        yield Lines(bytes(memoryview(data)[:cut]), count_newlines(data, cut) + 1), cut + 1, b""
        if buffer is None:
            buffer = bytearray(chunk_bytes)  # a large file: worth its buffer
        data = buffer
        size = handle.readinto(buffer) or 0
    pending = bytes(memoryview(data)[:size])
    while True:
        cut = pending.rfind(b"\n")
        if cut >= 0:
            yield Lines(pending[:cut], count_newlines(pending, cut) + 1), cut + 1, pending[cut + 1 :]
            pending = pending[cut + 1 :]
        block = handle.read(chunk_bytes)
        if not block:
            break
        pending += block
    yield Lines(b"", 0), 0, pending


def line_chunks(handle: BinaryIO, chunk_bytes: int) -> Iterator[tuple[Lines, int, bytes]]:
    """(complete lines, bytes they take, unterminated tail so far) per chunk read; the last
    item has no lines and no bytes, and the tail no newline ended."""
    if handle.seekable() and not isinstance(handle, gzip.GzipFile):
        yield from _seekable_line_chunks(handle, chunk_bytes)
        return
    pending = b""
    while True:
        block = handle.read(chunk_bytes)
        if not block:
            break
        data = pending + block
        cut = data.rfind(b"\n")
        if cut < 0:
            pending = data
            continue
        pending = data[cut + 1 :]
        yield Lines(data[:cut], count_newlines(data, cut) + 1), cut + 1, pending
    yield Lines(b"", 0), 0, pending


def prefetched(items: Iterator[T], ahead: int = 1) -> Generator[T, None, None]:
    """``items`` in order, each produced on a thread while the one before it is used.

    An object's next chunk is read (a copy of its bytes, its lines counted) while the parser
    works on this one: the parsers spend their time in polars and DuckDB with the GIL
    released, so the read overlaps them instead of taking its turn. At most ``ahead`` items
    wait, so memory stays bounded by chunks. An error producing an item is raised here, in
    its place; closing this generator (``contextlib.closing``) stops the thread and closes
    ``items`` before the caller goes on, e.g. to close the handle they read.
    """
    waiting: queue.Queue[tuple[bool, object]] = queue.Queue(maxsize=ahead)
    stop = threading.Event()

    def put(entry: tuple[bool, object]) -> bool:
        while not stop.is_set():
            try:
                waiting.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue  # the consumer is busy: look again whether it stopped
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((True, item)):
                    return
            put((False, None))
        except BaseException as exc:  # raised to the consumer, where the item would be
            put((False, exc))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="hybridtrace-read", daemon=True)
    thread.start()
    try:
        while True:
            produced, value = waiting.get()
            if produced:
                yield value  # type: ignore[misc]
            elif value is None:
                return
            else:
                raise value  # type: ignore[misc]
    finally:
        stop.set()
        thread.join()


def decode_lines(lines: Lines, first_line: int) -> tuple[list[str], list[dict]]:
    """Text of each line; undecodable lines become rejects and empty text (numbering kept)."""
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
