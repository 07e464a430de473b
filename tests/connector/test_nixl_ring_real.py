"""Real NIXL 1.5 agents writing their telemetry rings (BUFFER exporter): what the ring
reader rebuilds is, transfer for transfer, what the test moved and what
``get_xfer_telemetry`` said; errors are counted; a full ring says it lost events."""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path

import numpy as np
import pytest
from nixl._api import nixl_agent, nixl_agent_config

from hybridtrace.ingest.nixl_ring import parse_ring

pytestmark = pytest.mark.connector

BLOCK = 4096
# NIXL flushes its staging queue to the ring every 100 ms by default
FLUSH_S = 0.5


@pytest.fixture
def agents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A target and an initiator whose telemetry goes to ring files in ``tmp_path``
    (read by NIXL when each agent is made)."""
    monkeypatch.setenv("NIXL_TELEMETRY_ENABLE", "y")
    monkeypatch.setenv("NIXL_TELEMETRY_DIR", str(tmp_path))
    made = []

    def make(name: str, capacity: int = 4096):
        monkeypatch.setenv("NIXL_TELEMETRY_BUFFER_SIZE", str(capacity))
        target, reader = (nixl_agent(f"{name}-{side}", nixl_agent_config(backends=["UCX"]))
                          for side in ("target", "reader"))
        src = np.random.default_rng(1).integers(0, 255, 256 * BLOCK, dtype=np.uint8)
        dst = np.zeros_like(src)
        target.register_memory(target.get_reg_descs([(src.ctypes.data, src.nbytes, 0, "")], "DRAM"))
        reader.register_memory(reader.get_reg_descs([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM"))
        remote = reader.add_remote_agent(target.get_agent_metadata())
        local = reader.prep_xfer_dlist("NIXL_INIT_AGENT", np.array(
            [(dst.ctypes.data + i * BLOCK, BLOCK, 0) for i in range(256)], dtype=np.int64), "DRAM")
        far = reader.prep_xfer_dlist(remote, np.array(
            [(src.ctypes.data + i * BLOCK, BLOCK, 0) for i in range(256)], dtype=np.int64), "DRAM")
        pair = {"target": [target], "reader": reader, "local": local, "remote": far, "src": src, "dst": dst,
                "ring": tmp_path / f"{name}-reader"}
        made.append(pair)
        return pair

    yield make
    for pair in made:
        pair["target"].clear()


def move(pair, op: str, ids: list[int]) -> tuple[str, int, int, int]:
    reader, idx = pair["reader"], np.asarray(ids, dtype=np.int32)
    handle = reader.make_prepped_xfer(op, pair["local"], idx, pair["remote"], idx, b"")
    state = reader.transfer(handle)
    while state == "PROC":
        time.sleep(0.0002)
        state = reader.check_xfer_state(handle)
    assert state == "DONE"
    t = reader.get_xfer_telemetry(handle)
    reader.release_xfer_handle(handle)
    return ("read" if op == "READ" else "write", t.postDuration, t.xferDuration, t.totalBytes)


def snapshot(pair):
    time.sleep(FLUSH_S)
    return parse_ring(Path(pair["ring"]).read_bytes(), pair["ring"].name)


def full_snapshot(pair, within_s: float = 15.0):
    """The ring once NIXL has flushed into it all it will: on a loaded machine its flushing
    thread can run late, so the wait is for the state (full, or NIXL's dropped-events count
    written), not for a fixed time."""
    deadline = time.monotonic() + within_s
    ring = snapshot(pair)
    while not (ring.full or ring.dropped_events) and time.monotonic() < deadline:
        time.sleep(0.1)
        ring = parse_ring(Path(pair["ring"]).read_bytes(), pair["ring"].name)
    return ring


def test_the_ring_holds_each_transfer_as_nixl_reported_it(agents):
    pair = agents("moves")
    plan = [("READ", [0]), ("READ", [3, 5, 7]), ("WRITE", list(range(20, 36))),
            ("READ", list(range(40, 104, 2))), ("WRITE", [200]), ("READ", list(range(100, 228)))]
    seen = [move(pair, op, ids) for op, ids in plan]
    for (_, ids), (_, _, _, total) in zip(plan, seen, strict=True):
        assert total == len(ids) * BLOCK  # what moved
    ring = snapshot(pair)
    assert ring.version == 4 and ring.capacity == 4096 and not ring.full
    assert [(t.direction, t.post_us, t.xfer_us, t.bytes) for t in ring.transfers] == seen
    assert ring.registered_bytes == 256 * BLOCK and not ring.errors
    # the file was only read
    assert parse_ring(Path(pair["ring"]).read_bytes(), "again").read_pos == 0


def test_a_second_snapshot_holds_the_first_and_the_new_transfers_after_it(agents):
    pair = agents("grows")
    first = [move(pair, "READ", [i, i + 1]) for i in range(0, 20, 2)]
    before = snapshot(pair)
    later = [move(pair, "WRITE", [i]) for i in range(100, 105)]
    after = snapshot(pair)
    old = {(t.slot, t.direction, t.post_us, t.xfer_us, t.bytes) for t in before.transfers}
    new = [t for t in after.transfers if (t.slot, t.direction, t.post_us, t.xfer_us, t.bytes) not in old]
    assert [(t.direction, t.post_us, t.xfer_us, t.bytes) for t in before.transfers] == first
    assert [(t.direction, t.post_us, t.xfer_us, t.bytes) for t in new] == later


def test_failures_are_error_counts_not_transfers(agents):
    pair = agents("fails")
    ok = move(pair, "READ", [1])
    reader = pair["reader"]
    # a list prepared for an agent NIXL does not know: NIXL counts the status it returned
    with pytest.raises(Exception, match="NOT_FOUND"):
        one = np.array([(pair["src"].ctypes.data, BLOCK, 0)], dtype=np.int64)
        reader.prep_xfer_dlist("nobody", one, "DRAM")
    pair["target"].clear()  # the target goes away: the next post is refused
    gc.collect()
    time.sleep(0.3)
    idx = np.asarray([2], dtype=np.int32)
    handle = reader.make_prepped_xfer("READ", pair["local"], idx, pair["remote"], idx, b"")
    with pytest.raises(Exception, match="DISCONNECT"):
        reader.transfer(handle)
    reader.release_xfer_handle(handle)
    ring = snapshot(pair)
    # the refused post never completed: NIXL 1.5 writes no event for it, and no transfer is made up
    assert [(t.direction, t.post_us, t.xfer_us, t.bytes) for t in ring.transfers] == [ok]
    assert ring.errors == {"not_found": 1} and not ring.incomplete_groups


def test_a_full_ring_reports_lost_events(agents):
    pair = agents("full", capacity=32)
    seen = [move(pair, "READ", [i]) for i in range(12)]  # 1 + 48 events for 31 usable slots
    ring = full_snapshot(pair)
    # NIXL loses the later events either way, as the timing of its flush decides: the ring
    # fills up (31 events, the 8th READ's group cut short), or its staging queue overflows
    # first and it writes how many it dropped
    assert ring.full or ring.dropped_events > 0
    if ring.full:
        assert ring.events == 31 and ring.incomplete_groups == 1
    # the ring keeps the first events: the transfers it holds whole are the first ones
    kept = [(t.direction, t.post_us, t.xfer_us, t.bytes) for t in ring.transfers]
    assert kept == seen[: len(kept)]
    assert len(ring.transfers) == 7
    assert os.path.getsize(pair["ring"]) == 40 + 16 * 32


def test_ingest_adds_exactly_the_new_transfers_of_a_live_ring(agents, tmp_path: Path):
    from hybridtrace.ingest.run import ingest
    from hybridtrace.store import Store

    pair = agents("live")
    first = [move(pair, "READ", [i]) for i in range(6)]
    time.sleep(FLUSH_S)
    store = tmp_path / "store"
    ingest([pair["ring"]], store)
    more = [move(pair, "WRITE", [i, i + 1]) for i in range(10, 16, 2)]
    time.sleep(FLUSH_S)
    os.utime(pair["ring"])  # NIXL writes through a mapping; make sure the listing sees the change
    ingest([pair["ring"]], store)
    con = Store(store).connect()
    rows = con.sql("SELECT direction, post_us, xfer_us, transported_bytes FROM nixl_transfers "
                   "ORDER BY seq").fetchall()
    assert rows == first + more
    rings = con.sql("SELECT count(*), max(ring_full::INT), max(events_lost::INT) FROM nixl_rings").fetchall()
    assert rings == [(2, 0, 0)]


def test_ingest_says_a_full_ring_lost_events(agents, tmp_path: Path):
    from hybridtrace.ingest.run import ingest
    from hybridtrace.store import Store

    pair = agents("fullstore", capacity=32)
    for i in range(12):
        move(pair, "READ", [i])
    ring = full_snapshot(pair)
    ingest([pair["ring"]], tmp_path / "store")
    con = Store(tmp_path / "store").connect()
    snapshot = con.sql("SELECT events_lost, ring_full, transfers, dropped_events FROM nixl_rings").fetchall()
    assert snapshot == [(True, ring.full, 7, ring.dropped_events)]
