"""NIXL's telemetry ring files (``$NIXL_TELEMETRY_DIR/<agent name>``) → transfers and counts.

Each NIXL agent with the BUFFER exporter maps one file: a 40-byte header (write and read
positions, format version twice, capacity, mask) and ``capacity`` event slots. An event
is one reading (bytes of one request, µs of one post, …), with no time (from format 2
on), no rank, no peer. One completed transfer is a group of events: post time, transfer
time, bytes, request count; an error is one event per status.

Every layout NIXL has shipped is read, chosen by the header's version and the event size
(``(size - 40) / capacity``), never by a release number:

- v1 (NIXL 0.5.1-1.0.1): 56-byte events: µs timestamp, category, a 32-byte name, value;
- v2 (1.1-1.2): 16 bytes: category, event id, value;
- v3 (1.3.0, 1.3.2) and v4 (1.3.1, 1.4, …): 16 bytes: event id, padding, value; v4 adds
  id 20, the count of events NIXL's staging queue dropped, and writes a transfer's four
  events as one batch (v3 and earlier append the post time apart, so another thread's
  events may come between);
- a later version with 16-byte events is read as v4; event ids it adds are counted, not
  guessed at.

The file is only read: NIXL's own reader writes ``read_pos`` back and one of them
unlinks a file whose version it does not expect; hybridtrace does neither. Nothing
drains a ring unless someone runs such a reader: the ring then keeps its first
``capacity - 1`` events and drops the rest (it does not overwrite the oldest), and a
full ring is reported as ``lost`` rather than passed off as complete.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

HEADER = struct.Struct("<QQiiQQ")  # write_pos, read_pos, version, expected_version, capacity, mask
HEADER_BYTES = HEADER.size  # 40

# Event ids of formats 2-4 (nixl_telemetry_event_type_t).
TX_BYTES, RX_BYTES, TX_REQUESTS, RX_REQUESTS = 0, 1, 2, 3
MEMORY_REGISTERED, MEMORY_DEREGISTERED = 4, 5
XFER_TIME, POST_TIME = 6, 7
ERRORS = {
    8: "not_posted", 9: "invalid_param", 10: "backend", 11: "not_found", 12: "mismatch",
    13: "not_allowed", 14: "repost_active", 15: "unknown", 16: "not_supported",
    17: "remote_disconnect", 18: "canceled", 19: "no_telemetry",
}  # fmt: skip
EVENTS_DROPPED = 20
NAMES = {
    "agent_tx_bytes": TX_BYTES, "agent_rx_bytes": RX_BYTES,
    "agent_tx_requests_num": TX_REQUESTS, "agent_rx_requests_num": RX_REQUESTS,
    "agent_memory_registered": MEMORY_REGISTERED, "agent_memory_deregistered": MEMORY_DEREGISTERED,
    "agent_xfer_time": XFER_TIME, "agent_xfer_post_time": POST_TIME,
    "agent_telemetry_events_dropped": EVENTS_DROPPED,
    **{f"agent_err_{status}": event for event, status in ERRORS.items()},
}  # fmt: skip
V1_EVENT = struct.Struct("<Qi32s4xQ")  # timestamp µs, category, name, value: 56 bytes
V1_ERROR_CATEGORY = 4
# A ring no NIXL release could write: refuse it before allocating for it.
MAX_CAPACITY = 1 << 22  # 4M events, 64 MiB: far above NIXL's default of 4,096


class RingError(ValueError):
    """Not a NIXL telemetry ring, or one no layout explains."""


@dataclass
class Transfer:
    seq: int  # completed transfers before this one in the ring (its place: the ring has no clock)
    slot: int  # ring slot of its first event
    direction: str  # "read" (NIXL RX: this agent pulled) or "write"
    post_us: int | None
    xfer_us: int | None
    bytes: int | None
    ts_us: int | None = None  # format 1 events carry a wall-clock time


@dataclass
class Ring:
    agent: str
    version: int
    event_bytes: int
    capacity: int
    write_pos: int
    read_pos: int
    events: int  # events in the snapshot (read_pos .. write_pos)
    transfers: list[Transfer] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    dropped_events: int = 0  # what NIXL's staging queue said it dropped (v4 event 20)
    unknown_events: dict[int, int] = field(default_factory=dict)
    registered_bytes: int = 0
    deregistered_bytes: int = 0
    incomplete_groups: int = 0  # events of a transfer whose group is cut (a full ring, a disabled metric)

    @property
    def full(self) -> bool:
        """The ring had no room left: NIXL discarded every event after these."""
        return self.events >= self.capacity - 1


def looks_like_ring(head: bytes, size: int) -> bool:
    """A ring file's header, by its own consistency: equal versions, a power-of-two
    capacity with its mask, positions inside it, and a size of exactly 40 + slots × a
    layout's event size. Text never passes (a version word would be four ASCII bytes)."""
    if len(head) < HEADER_BYTES:
        return False
    write_pos, read_pos, version, expected, capacity, mask = HEADER.unpack_from(head, 0)
    if not (0 < version == expected < 1024) or not (2 <= capacity <= MAX_CAPACITY):
        return False
    if capacity & (capacity - 1) or mask != capacity - 1 or write_pos >= capacity or read_pos >= capacity:
        return False
    return size - HEADER_BYTES == capacity * (V1_EVENT.size if version == 1 else 16)


def parse_ring(data: bytes | memoryview, agent: str) -> Ring:
    """One snapshot of a ring file's bytes (read once, whole: the writer may move on)."""
    if len(data) < HEADER_BYTES:
        raise RingError(f"{len(data)} bytes: shorter than a ring header")
    write_pos, read_pos, version, expected, capacity, mask = HEADER.unpack_from(data, 0)
    if capacity < 2 or capacity > MAX_CAPACITY or capacity & (capacity - 1) or mask != capacity - 1:
        raise RingError(f"capacity {capacity} with mask {mask}: not a NIXL ring header")
    if version != expected or version < 1:
        raise RingError(f"version {version}, expected_version {expected}: not a NIXL ring header")
    if (len(data) - HEADER_BYTES) % capacity:
        raise RingError(f"{len(data) - HEADER_BYTES} data bytes do not divide into {capacity} slots")
    event_bytes = (len(data) - HEADER_BYTES) // capacity
    if write_pos >= capacity or read_pos >= capacity:
        raise RingError(f"positions {read_pos}..{write_pos} outside {capacity} slots")
    if (version == 1 and event_bytes != V1_EVENT.size) or (version > 1 and event_bytes != 16):
        raise RingError(f"format {version} with {event_bytes}-byte events: no NIXL layout has that")
    count = (write_pos - read_pos) & mask
    slots = [(read_pos + i) & mask for i in range(count)]
    body = memoryview(data).cast("B")[HEADER_BYTES:]
    ring = Ring(agent=agent, version=version, event_bytes=event_bytes, capacity=capacity,
                write_pos=write_pos, read_pos=read_pos, events=count)
    if version == 1:
        ids, values, stamps, errors = _v1_events(body, slots)
        for status in errors:
            ring.errors[status] = ring.errors.get(status, 0) + 1
    else:
        ids, values = _v16_events(body, slots, id_at=4 if version == 2 else 0)
        stamps = None
    _rebuild(ring, ids, values, stamps, slots, batched=version >= 4)
    return ring


def _v16_events(body: memoryview, slots: list[int], id_at: int) -> tuple[list[int], list[int]]:
    words, longs = body.cast("I"), body.cast("Q")  # views of the same bytes: no copy
    ids = [words[slot * 4 + id_at // 4] for slot in slots]
    values = [longs[slot * 2 + 1] for slot in slots]
    return ids, values


def _v1_events(body: memoryview, slots: list[int]) -> tuple[list[int], list[int], list[int], list[str]]:
    ids, values, stamps, errors = [], [], [], []
    for slot in slots:
        stamp, category, raw, value = V1_EVENT.unpack_from(body, slot * V1_EVENT.size)
        name = raw.split(b"\0", 1)[0].decode("ascii", "replace")
        if category == V1_ERROR_CATEGORY and name not in NAMES:
            # format 1 named errors by their status string (NIXL_ERR_BACKEND, …)
            errors.append(name.lower().removeprefix("nixl_err_") or "unknown")
            ids.append(-1)
        else:
            ids.append(NAMES.get(name, -2))
        values.append(value)
        stamps.append(stamp)
    return ids, values, stamps, errors


def _rebuild(ring: Ring, ids: list[int], values: list[int], stamps: list[int] | None,
             slots: list[int], *, batched: bool) -> None:
    """Transfers from their event groups; everything else counted.

    A group is POST_TIME, XFER_TIME, BYTES, REQUESTS (a metric turned off by
    NIXL_TELEMETRY_ENABLED_METRICS leaves its event out). Before v4 the post time was
    appended on its own, so a group's other events pair with the oldest post time not yet
    used; from v4 on a group is always contiguous.
    """
    posts: list[tuple[int, int]] = []  # (position, value) of post times not yet in a group
    open_group: dict | None = None

    def close(group: dict) -> None:
        if group.get("direction") is None:  # no bytes, no request count: nothing says what it was
            ring.incomplete_groups += 1
            return
        first = group["first"]
        ring.transfers.append(Transfer(
            seq=len(ring.transfers), slot=slots[first], direction=group["direction"],
            post_us=group.get("post"), xfer_us=group.get("xfer"), bytes=group.get("bytes"),
            ts_us=stamps[first] if stamps is not None else None,
        ))

    for i, (event, value) in enumerate(zip(ids, values, strict=True)):
        if event == POST_TIME:
            if batched:
                if open_group is not None:
                    close(open_group)
                open_group = {"first": i, "post": value}
            else:
                posts.append((i, value))
        elif event in (XFER_TIME, TX_BYTES, RX_BYTES, TX_REQUESTS, RX_REQUESTS):
            if open_group is None or (event == XFER_TIME and "xfer" in open_group):
                if open_group is not None:
                    close(open_group)
                open_group = {"first": i}
                if not batched and posts:
                    first, post = posts.pop(0)
                    open_group.update(first=first, post=post)
            if event == XFER_TIME:
                open_group["xfer"] = value
            elif event in (TX_BYTES, RX_BYTES):
                open_group["bytes"] = value
                open_group["direction"] = "write" if event == TX_BYTES else "read"
            else:
                open_group.setdefault("direction", "write" if event == TX_REQUESTS else "read")
                close(open_group)
                open_group = None
        elif event in ERRORS:
            ring.errors[ERRORS[event]] = ring.errors.get(ERRORS[event], 0) + 1
        elif event == EVENTS_DROPPED:
            ring.dropped_events += value
        elif event == MEMORY_REGISTERED:
            ring.registered_bytes += value
        elif event == MEMORY_DEREGISTERED:
            ring.deregistered_bytes += value
        elif event != -1:  # -1: a format 1 error, counted already
            ring.unknown_events[event] = ring.unknown_events.get(event, 0) + 1
    if open_group is not None:  # the ring ended inside a group: a full ring, or a cut snapshot
        ring.incomplete_groups += 1
    ring.incomplete_groups += len(posts) if not batched else 0


def ring_tables(ring: Ring, source_id: str, read_at: float) -> tuple[pa.Table, pa.Table]:
    """The ``nixl_transfers`` rows and the ``nixl_rings`` row of one snapshot."""
    import json

    import pyarrow as pa

    from hybridtrace.schema import table_schema

    rows = ring.transfers
    transfers = pa.table({
        "agent": [ring.agent] * len(rows),
        "direction": [t.direction for t in rows],
        "post_us": pa.array([t.post_us for t in rows], pa.int64()),
        "xfer_us": pa.array([t.xfer_us for t in rows], pa.int64()),
        "transported_bytes": pa.array([t.bytes for t in rows], pa.int64()),
        "seq": pa.array([t.seq for t in rows], pa.int64()),
        "slot": pa.array([t.slot for t in rows], pa.int64()),
        "ts": pa.array([None if t.ts_us is None else t.ts_us / 1e6 for t in rows], pa.float64()),
        "ring_version": pa.array([ring.version] * len(rows), pa.int32()),
        "snapshot_id": [source_id] * len(rows),
        "source_id": [source_id] * len(rows),
        "line_number": pa.array([t.seq + 1 for t in rows], pa.int64()),
    })
    unknown = json.dumps({str(k): v for k, v in sorted(ring.unknown_events.items())})
    snapshot = pa.table({
        "agent": [ring.agent], "snapshot_id": [source_id], "read_at": [read_at],
        "ring_version": pa.array([ring.version], pa.int32()),
        "event_bytes": pa.array([ring.event_bytes], pa.int32()),
        "capacity": [ring.capacity], "events": [ring.events], "transfers": [len(rows)],
        "errors": [json.dumps(ring.errors, sort_keys=True)], "error_count": [sum(ring.errors.values())],
        "dropped_events": [ring.dropped_events], "ring_full": [ring.full],
        # NIXL loses events two ways: a ring with no room left, or its staging queue overflowing
        # before a flush (then it writes the dropped-events marker instead)
        "events_lost": [ring.full or ring.dropped_events > 0],
        "incomplete_groups": [ring.incomplete_groups], "unknown_events": [unknown],
        "registered_bytes": [ring.registered_bytes], "source_id": [source_id], "line_number": [1],
    })  # fmt: skip
    return table_schema("nixl_transfers").conform(transfers), table_schema("nixl_rings").conform(snapshot)
