"""Chunks read ahead on a thread come in order, raise where they would have, and stop when
the reader is closed early."""

from __future__ import annotations

import contextlib
import io
import itertools
import threading

import pytest

from hybridtrace.ingest.stream import line_chunks, prefetched


def _reader_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "hybridtrace-read")


def test_items_come_in_order_and_the_thread_ends() -> None:
    assert list(prefetched(iter(range(100)))) == list(range(100))
    assert list(prefetched(iter([]))) == []
    assert _reader_threads() == 0


def test_line_chunks_read_ahead_are_the_same_chunks() -> None:
    data = b"".join(b'{"n": %d}\n' % i for i in range(5000)) + b"tail"
    direct = [(c[0].block, c[0].count, c[1], c[2]) for c in line_chunks(io.BytesIO(data), 4096)]
    ahead = [(c[0].block, c[0].count, c[1], c[2]) for c in prefetched(line_chunks(io.BytesIO(data), 4096))]
    assert ahead == direct
    assert len(direct) > 10


def test_an_error_is_raised_in_its_place() -> None:
    def failing():
        yield 1
        yield 2
        raise OSError("the object went away")

    got = []
    with pytest.raises(OSError, match="went away"):
        for item in prefetched(failing()):
            got.append(item)
    assert got == [1, 2]
    assert _reader_threads() == 0


def test_closing_early_stops_the_reader_and_closes_its_source() -> None:
    closed = threading.Event()

    def endless():
        try:
            yield from itertools.count()
        finally:
            closed.set()

    chunks = prefetched(endless())
    with contextlib.closing(chunks):
        for item in chunks:
            if item == 3:
                break
    assert closed.is_set()  # the source was closed before closing() returned
    assert _reader_threads() == 0
