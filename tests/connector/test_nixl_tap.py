"""Real NIXL: two agents exchange host-memory READs over UCX on loopback through the tap.

Every read's record must say what moved: its bytes equal the sum of the descriptors
posted (and the bytes that changed in the destination), its descriptor count and post
time are NIXL's own telemetry of that handle, and a read whose target went away is a
failed read with the remote request id still known from its notification.
"""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest
from nixl._api import nixl_agent, nixl_agent_config

from hybridtrace.connector import records
from hybridtrace.connector.tap import AgentTap, Read, read_facts
from hybridtrace.trace_v1 import validate

pytestmark = pytest.mark.connector

BLOCK = 4096
BLOCKS = 64


def _agent(name: str):
    return nixl_agent(name, nixl_agent_config(backends=["UCX"], capture_telemetry=True))


@pytest.fixture
def pair():
    """(tap on the reading agent, [target agent], source buffer, destination buffer, handles)."""
    target, reader = _agent("prefill-rank0"), _agent("decode-rank0")
    rng = np.random.default_rng(7)
    src = rng.integers(0, 255, BLOCK * BLOCKS, dtype=np.uint8)
    dst = np.zeros_like(src)
    target.register_memory(target.get_reg_descs([(src.ctypes.data, src.nbytes, 0, "")], "DRAM"))
    reader.register_memory(reader.get_reg_descs([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM"))
    done: list[Read] = []
    tap = AgentTap(reader, done.append)
    remote = tap.add_remote_agent(target.get_agent_metadata())
    # the local list strided (Nx5, as vLLM 0.33 prepares it), the remote one Nx3
    local = tap.prep_xfer_dlist("NIXL_INIT_AGENT", np.array([(dst.ctypes.data, BLOCK, 0, BLOCK, BLOCKS)],
                                                             dtype=np.int64), "DRAM")
    remote_list = np.array([(src.ctypes.data + i * BLOCK, BLOCK, 0) for i in range(BLOCKS)], dtype=np.int64)
    remote_handle = tap.prep_xfer_dlist(remote, remote_list, "DRAM")
    alive = [target]  # a test may drop the target: nothing else here holds it
    del target
    yield tap, alive, src, dst, local, remote_handle, done


def _read(tap, local, remote, ids, notif: bytes):
    handle = tap.make_prepped_xfer("READ", local, ids, remote, ids, notif)
    state = tap.transfer(handle)
    deadline = time.monotonic() + 20
    while state == "PROC" and time.monotonic() < deadline:
        time.sleep(0.0005)
        state = tap.check_xfer_state(handle)
    assert state == "DONE", state
    telemetry = tap.get_xfer_telemetry(handle)
    seen = (telemetry.totalBytes, telemetry.descCount, telemetry.postDuration)
    tap.release_xfer_handle(handle)
    return seen


@pytest.mark.parametrize(
    "ids",
    [
        [0],                          # one descriptor
        [3, 4, 5, 6],                 # neighbours: NIXL merges them into one
        [1, 9, 17, 33, 60],           # scattered: five descriptors
        list(range(0, BLOCKS, 2)),    # 32 descriptors, 128 KiB
        list(range(BLOCKS)),          # everything, 256 KiB
    ],
)
def test_read_records_say_what_moved(pair, ids):
    tap, _, src, dst, local, remote, done = pair
    idx = np.asarray(ids, dtype=np.int32)
    total, descs, post_us = _read(tap, local, remote, idx, f"cmpl-{len(ids)}-0:1".encode())
    assert len(done) == 1
    facts = read_facts(done[0])
    blocks, sources = dst.reshape(BLOCKS, BLOCK), src.reshape(BLOCKS, BLOCK)
    assert (blocks[ids] == sources[ids]).all()  # the source's bytes, block for block
    assert not blocks[[i for i in range(BLOCKS) if i not in ids]].any()  # and nothing else
    assert facts["status"] == "ok"
    assert facts["transported_bytes"] == len(ids) * BLOCK == total
    assert facts["descriptors"] == descs
    assert facts["post_s"] == pytest.approx(post_us / 1e6)
    assert facts["xfer_s"] >= 0 and abs(facts["ts"] - time.time()) < 60
    assert facts["remote_request_id"] == f"cmpl-{len(ids)}-0"
    # the posted descriptors' lengths, as the tap read them from the prepared list
    assert int(tap.dlists[local][idx].sum()) == total
    record = records.transfer_record(
        request_id="r", engine_id="decode-0", remote_engine_id="prefill-0", rank=0, tp_size=1,
        remote_rank=0, remote_tp_size=1, staging_bytes=0, **facts,
    )
    assert validate(record) == []


def test_merged_descriptors_are_nixls_count(pair):
    tap, _, _, _, local, remote, done = pair
    _read(tap, local, remote, np.array([3, 4, 5, 6, 20], dtype=np.int32), b"m:1")
    # four neighbours and one more: NIXL posts two descriptors for five indices
    assert read_facts(done[0])["descriptors"] == 2


def test_a_read_whose_target_went_away_is_failed(pair):
    tap, alive, _, _, local, remote, done = pair
    alive.clear()
    gc.collect()
    time.sleep(0.3)
    idx = np.array([2], dtype=np.int32)
    handle = tap.make_prepped_xfer("READ", local, idx, remote, idx, b"cmpl-lost:1")
    with pytest.raises(Exception, match="DISCONNECT"):
        tap.transfer(handle)
    tap.release_xfer_handle(handle)
    facts = read_facts(done[-1])
    assert facts["status"] == "failed"
    assert facts["transported_bytes"] == 0
    assert facts["remote_request_id"] == "cmpl-lost"


def test_the_tap_passes_everything_else_through(pair):
    tap, *_ = pair
    assert tap.name == "decode-rank0"
    assert isinstance(tap.get_agent_metadata(), bytes)
