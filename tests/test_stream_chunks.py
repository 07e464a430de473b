"""A plain file is cut into the same chunks of whole lines as a stream of the same bytes."""

from __future__ import annotations

import io
import random

import pytest

from hybridtrace.ingest import stream
from hybridtrace.ingest.stream import count_newlines, line_chunks


class _Stream(io.RawIOBase):
    """The bytes as a handle that cannot seek: line_chunks' carrying path."""

    def __init__(self, data: bytes) -> None:
        self.inner = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[no-untyped-def]
        return self.inner.readinto(b)


def _chunks(handle, size: int) -> list[tuple[bytes, int, int, bytes]]:  # type: ignore[no-untyped-def]
    return [(lines.block, len(lines), consumed, tail) for lines, consumed, tail in line_chunks(handle, size)]


@pytest.mark.parametrize("seed", range(6))
def test_a_file_and_a_stream_give_the_same_chunks(tmp_path, seed):
    rng = random.Random(seed)
    lines = [b"x" * rng.choice([0, 1, 5, 40, 200]) for _ in range(rng.randint(1, 300))]
    data = b"\n".join(lines) + rng.choice([b"", b"\n", b"tail without newline"])
    path = tmp_path / "f"
    path.write_bytes(data)
    for size in (7, 64, 256, len(data), len(data) + 1):
        with open(path, "rb") as handle:
            from_file = _chunks(handle, size)
        from_stream = _chunks(io.BufferedReader(_Stream(data)), size)
        # the same lines in all, whichever way they were cut
        assert b"".join(block + b"\n" for block, n, _, _ in from_file if n) == b"".join(
            block + b"\n" for block, n, _, _ in from_stream if n
        )
        assert sum(n for _, n, _, _ in from_file) == sum(n for _, n, _, _ in from_stream) == data.count(b"\n")
        assert from_file[-1][3] == from_stream[-1][3] == data[data.rfind(b"\n") + 1 :]
        assert sum(consumed for _, _, consumed, _ in from_file) == data.rfind(b"\n") + 1


@pytest.mark.parametrize("seed", range(3))
def test_large_chunks_count_their_lines_as_small_ones_do(tmp_path, seed, monkeypatch):
    # chunks above the size counted by polars give the counts bytes.count gives
    rng = random.Random(seed)
    lines = [b"y" * rng.choice([0, 1, 3, 90, 700]) for _ in range(rng.randint(4000, 9000))]
    data = b"\n".join(lines) + b"\npartial"
    for end in (0, 1, len(data) // 3, len(data) - 8, len(data)):
        assert count_newlines(data, end) == count_newlines(bytearray(data), end) == data.count(b"\n", 0, end)
    path = tmp_path / "f"
    path.write_bytes(data)
    size = 1 << 18
    with open(path, "rb") as handle:
        vector = _chunks(handle, size)
    monkeypatch.setattr(stream, "_VECTOR_COUNT_BYTES", 1 << 40)  # bytes.count everywhere
    with open(path, "rb") as handle:
        assert _chunks(handle, size) == vector
    monkeypatch.setattr(stream, "_VECTOR_COUNT_BYTES", 16)  # polars everywhere but the smallest
    with open(path, "rb") as handle:
        assert _chunks(handle, size) == vector
    assert sum(n for _, n, _, _ in vector) == data.count(b"\n")


@pytest.mark.parametrize("seed", range(4))
def test_a_file_read_whole_chunk_by_chunk_cuts_where_the_buffered_read_does(tmp_path, seed, monkeypatch):
    # lines long and short (some longer than the window that finds a chunk's end), and an end
    # with and without a newline: the exact reads give the chunks the buffered path gives
    rng = random.Random(seed)
    sizes = [0, 1, 40, 900, 5000, 70_000, 200_000]
    lines = [b"z" * rng.choice(sizes) for _ in range(rng.randint(50, 400))]
    data = b"\n".join(lines) + rng.choice([b"", b"\n", b"tail without newline"])
    path = tmp_path / "f"
    path.write_bytes(data)
    for size in (1 << 17, 1 << 18, 3 * (1 << 17) + 5, len(data) + 1):
        with open(path, "rb") as handle:
            exact = _chunks(handle, size)
            assert handle.tell() == len(data)
        with monkeypatch.context() as m:
            m.setattr(stream, "_CUT_WINDOW", 1 << 40)  # the buffered read only
            with open(path, "rb") as handle:
                assert _chunks(handle, size) == exact
        from_stream = _chunks(io.BufferedReader(_Stream(data)), size)
        assert b"".join(b + b"\n" for b, n, _, _ in exact if n) == b"".join(
            b + b"\n" for b, n, _, _ in from_stream if n
        )
    # a read that starts inside the file (a resumed object) takes its lines from there
    with open(path, "rb") as handle:
        start = data.find(b"\n") + 1
        handle.seek(start)
        rest = _chunks(handle, 1 << 17)
    assert b"".join(b + b"\n" for b, n, _, _ in rest if n) + rest[-1][3] == data[start:]
