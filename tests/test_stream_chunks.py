"""A plain file is cut into the same chunks of whole lines as a stream of the same bytes."""

from __future__ import annotations

import io
import random

import pytest

from hybridtrace.ingest.stream import line_chunks


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
