"""NIXL telemetry ring files, every layout NIXL shipped, built byte by byte from the
documented structs (no real files of the older versions exist here)."""

from __future__ import annotations

import os
import struct

import pytest

from hybridtrace.ingest.nixl_ring import (
    HEADER,
    POST_TIME,
    RX_BYTES,
    RX_REQUESTS,
    TX_BYTES,
    TX_REQUESTS,
    V1_EVENT,
    XFER_TIME,
    RingError,
    parse_ring,
)

CAPACITY = 16


def ring_bytes(events: list[tuple[int, int]], *, version: int = 4, capacity: int = CAPACITY,
               read_pos: int = 0, categories: dict[int, int] | None = None) -> bytes:
    """A ring of 16-byte events (formats 2-4 and later): (event id, value) from ``read_pos``."""
    body = bytearray(16 * capacity)
    for i, (event, value) in enumerate(events):
        slot = (read_pos + i) % capacity
        if version == 2:  # category @0, event id @4
            struct.pack_into("<iIQ", body, slot * 16, (categories or {}).get(event, 1), event, value)
        else:  # event id @0, padding, value @8
            struct.pack_into("<I4xQ", body, slot * 16, event, value)
    write_pos = (read_pos + len(events)) % capacity
    return HEADER.pack(write_pos, read_pos, version, version, capacity, capacity - 1) + bytes(body)


def v1_ring(events: list[tuple[int, int, str, int]], capacity: int = CAPACITY) -> bytes:
    """Format 1: (timestamp µs, category, name, value) in 56-byte events."""
    body = bytearray(V1_EVENT.size * capacity)
    for slot, (stamp, category, name, value) in enumerate(events):
        V1_EVENT.pack_into(body, slot * V1_EVENT.size, stamp, category, name.encode(), value)
    return HEADER.pack(len(events), 0, 1, 1, capacity, capacity - 1) + bytes(body)


def read(post: int, xfer: int, nbytes: int) -> list[tuple[int, int]]:
    return [(POST_TIME, post), (XFER_TIME, xfer), (RX_BYTES, nbytes), (RX_REQUESTS, 1)]


def write(post: int, xfer: int, nbytes: int) -> list[tuple[int, int]]:
    return [(POST_TIME, post), (XFER_TIME, xfer), (TX_BYTES, nbytes), (TX_REQUESTS, 1)]


def facts(ring):
    return [(t.direction, t.post_us, t.xfer_us, t.bytes) for t in ring.transfers]


def test_v4_batches_become_one_transfer_each_and_the_rest_is_counted():
    events = [(4, 1 << 20), *read(12, 340, 65536), *write(8, 90, 4096), (17, 1), (17, 1), (9, 1),
              (20, 5), *read(30, 900, 1 << 20)]
    ring = parse_ring(ring_bytes(events, capacity=32), "agent-a")
    assert facts(ring) == [("read", 12, 340, 65536), ("write", 8, 90, 4096), ("read", 30, 900, 1 << 20)]
    assert [t.slot for t in ring.transfers] == [1, 5, 13]
    assert ring.errors == {"remote_disconnect": 2, "invalid_param": 1}
    assert ring.dropped_events == 5 and ring.registered_bytes == 1 << 20
    assert ring.events == len(events) == 17 and not ring.full and not ring.incomplete_groups
    assert ring.version == 4 and ring.event_bytes == 16


def test_v3_post_times_apart_pair_with_the_oldest_unused_one():
    # two threads: both post times land first, then each thread's other three events
    events = [(POST_TIME, 11), (POST_TIME, 22), (XFER_TIME, 100), (RX_BYTES, 10), (RX_REQUESTS, 1),
              (XFER_TIME, 200), (RX_BYTES, 20), (RX_REQUESTS, 1)]
    ring = parse_ring(ring_bytes(events, version=3), "agent-b")
    assert facts(ring) == [("read", 11, 100, 10), ("read", 22, 200, 20)]


def test_v2_carries_a_category_before_the_event_id():
    ring = parse_ring(ring_bytes([*write(5, 50, 777), (10, 1)], version=2), "agent-c")
    assert facts(ring) == [("write", 5, 50, 777)] and ring.errors == {"backend": 1}


def test_v1_names_its_events_and_stamps_them():
    t0 = 1_764_400_000_000_000
    events = [(t0, 5, "agent_xfer_post_time", 7), (t0 + 1, 5, "agent_xfer_time", 70),
              (t0 + 2, 1, "agent_rx_bytes", 4096), (t0 + 3, 1, "agent_rx_requests_num", 1),
              (t0 + 4, 4, "NIXL_ERR_REMOTE_DISCONNECT", 1)]
    ring = parse_ring(v1_ring(events), "agent-d")
    assert facts(ring) == [("read", 7, 70, 4096)]
    assert ring.transfers[0].ts_us == t0
    assert ring.errors == {"remote_disconnect": 1} and ring.event_bytes == 56


def test_a_later_version_with_16_byte_events_reads_as_v4_and_counts_new_ids():
    ring = parse_ring(ring_bytes([*read(1, 2, 3), (42, 9), (42, 9)], version=5), "agent-e")
    assert facts(ring) == [("read", 1, 2, 3)] and ring.unknown_events == {42: 2}


def test_a_full_ring_says_it_lost_events_and_a_cut_group_is_not_a_transfer():
    events = (read(1, 10, 100) * 4)[: CAPACITY - 1]  # 15 events: the fourth read is cut
    ring = parse_ring(ring_bytes(events), "agent-f")
    assert ring.full and len(ring.transfers) == 3 and ring.incomplete_groups == 1


def test_a_wrapped_ring_is_read_from_read_pos():
    events = [*read(1, 10, 100), *read(2, 20, 200)]
    ring = parse_ring(ring_bytes(events, read_pos=13), "agent-g")
    assert facts(ring) == [("read", 1, 10, 100), ("read", 2, 20, 200)]
    assert [t.slot for t in ring.transfers] == [13, 1]


def test_a_disabled_metric_shortens_the_group():
    ring = parse_ring(ring_bytes([(XFER_TIME, 50), (RX_BYTES, 64), (RX_REQUESTS, 1)]), "agent-h")
    assert facts(ring) == [("read", None, 50, 64)]


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"\0" * 10, "shorter than a ring header"),
        (HEADER.pack(0, 0, 4, 4, 12, 11) + b"\0" * 192, "not a NIXL ring header"),
        (HEADER.pack(0, 0, 4, 3, 16, 15) + b"\0" * 256, "not a NIXL ring header"),
        (HEADER.pack(0, 0, 4, 4, 16, 15) + b"\0" * 250, "do not divide"),
        (HEADER.pack(0, 0, 4, 4, 16, 15) + b"\0" * 16 * 56, "no NIXL layout"),
        (HEADER.pack(99, 0, 4, 4, 16, 15) + b"\0" * 256, "outside"),
        (HEADER.pack(0, 0, 4, 4, 1 << 40, (1 << 40) - 1), "not a NIXL ring header"),
    ],
)
def test_what_is_not_a_ring_says_why(data, reason):
    with pytest.raises(RingError, match=reason):
        parse_ring(data, "bad")


def test_ingest_reads_a_ring_as_snapshots_and_never_counts_a_transfer_twice(tmp_path):
    """A ring rewritten in place: each read is a snapshot; what an earlier one held is a
    duplicate, the new transfers are added, and the connector's engine record maps the agent."""
    import json

    from hybridtrace.ingest.run import ingest
    from hybridtrace.store import Store

    inputs, store = tmp_path / "in", tmp_path / "store"
    (inputs / "rings").mkdir(parents=True)
    agent = "3f2b9c1e-0d4a-4e8b-9a77-5c1d2e3f4a5b"
    ring = inputs / "rings" / agent
    ring.write_bytes(ring_bytes([*read(12, 340, 65536), *read(9, 200, 4096)], capacity=32))
    (inputs / "trace.jsonl").write_text(json.dumps({
        "type": "engine", "v": 1, "ts": 1764400000.0, "engine_id": "decode-0", "role": "decode", "tp_size": 2,
        "rank": 1, "agent_name": agent}) + "\n")
    ingest([inputs], store)

    def rows(sql):
        return Store(store).connect().sql(sql).fetchall()

    mapped = rows("SELECT agent, engine_id, rank, direction, transported_bytes FROM nixl_transfer_ranks "
                  "ORDER BY seq")
    assert mapped == [(agent, "decode-0", 1, "read", 65536), (agent, "decode-0", 1, "read", 4096)]
    # NIXL appends two more transfers in place: same size, a later modification time
    ring.write_bytes(ring_bytes([*read(12, 340, 65536), *read(9, 200, 4096), *write(5, 50, 512),
                                 *read(7, 70, 1024)], capacity=32))
    stat = ring.stat()
    os.utime(ring, (stat.st_atime, stat.st_mtime + 5))
    ingest([inputs], store)
    assert rows("SELECT seq, direction, transported_bytes FROM nixl_transfers ORDER BY seq") == [
        (0, "read", 65536), (1, "read", 4096), (2, "write", 512), (3, "read", 1024)]
    assert rows("SELECT count(*), sum(transfers) FROM nixl_rings") == [(2, 6)]
    assert rows("SELECT count(*) FROM rejects") == [(0,)]
    # unchanged: nothing new, no new manifest rows
    before = rows("SELECT count(*) FROM sources")
    ingest([inputs], store)
    assert rows("SELECT count(*) FROM sources") == before
