"""What tracing costs the engine, against the stock connector measured in the same run.

Three measurements (run with the connector tier's venv: vLLM 0.33 and NIXL installed):

1. engine thread, per read, NIXL calls: the calls vLLM makes for one READ
   (make_prepped_xfer, transfer, check_xfer_state, get_xfer_telemetry, release) on a real
   NIXL agent over UCX loopback, straight and through hybridtrace's tap; the difference is
   what the tap adds per read (goal: < 5 µs).
2. engine thread, per read, whole connector: real vLLM NIXL workers (the tests' harness),
   stock ``NixlConnector`` against ``hybridtrace.connector.vllm.NixlConnector``, the time
   spent in ``start_load_kv`` and ``get_finished`` per read, interleaved rounds.
3. the writer on one core: transfer records through ``TraceWriter`` (queue, build, encode,
   append) against building and appending the same records in a plain loop; the drop
   counter must stay 0 (goal: >= 200k records/s).

    python benchmarks/connector.py [--reads 20000] [--records 500000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("UCX_TLS", "tcp,self")
os.environ.setdefault("VLLM_SSM_CONV_STATE_LAYOUT", "DS")

import numpy as np

from hybridtrace.connector import records
from hybridtrace.connector.tap import AgentTap, Read, read_facts
from hybridtrace.connector.writer import TraceWriter, _encode

BLOCK = 4096
BLOCKS = 256


def _agents():
    from nixl._api import nixl_agent, nixl_agent_config

    config = nixl_agent_config(backends=["UCX"], capture_telemetry=True)
    target, reader = nixl_agent("bench-prefill", config), nixl_agent("bench-decode", config)
    src = np.ones(BLOCK * BLOCKS, dtype=np.uint8)
    dst = np.zeros_like(src)
    target.register_memory(target.get_reg_descs([(src.ctypes.data, src.nbytes, 0, "")], "DRAM"))
    reader.register_memory(reader.get_reg_descs([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM"))
    remote = reader.add_remote_agent(target.get_agent_metadata())
    return target, reader, remote, src, dst


def _one_read(agent, raw, local, remote, ids, notif) -> float:
    """Engine-thread seconds of one read's calls as vLLM makes them: make and post, one
    poll that sees it done, telemetry, release. The wait in between polls the raw agent,
    untimed (vLLM polls once per engine step, not in a loop)."""
    t = time.perf_counter()
    handle = agent.make_prepped_xfer("READ", local, ids, remote, ids, notif)
    state = agent.transfer(handle)
    spent = time.perf_counter() - t
    while state == "PROC" and raw.check_xfer_state(handle) == "PROC":
        time.sleep(0.0001)
    t = time.perf_counter()
    agent.check_xfer_state(handle)
    agent.get_xfer_telemetry(handle)
    agent.release_xfer_handle(handle)
    return spent + time.perf_counter() - t


class _NullAgent:
    """An agent whose calls cost nothing: what is left through the tap is the tap's own cost."""

    name = "null"

    def prep_xfer_dlist(self, agent_name, xfer_list, *args, **kwargs):
        return object()

    def make_prepped_xfer(self, *args, **kwargs):
        return object()

    def transfer(self, handle, *args):
        return "PROC"

    def check_xfer_state(self, handle):
        return "DONE"

    def get_xfer_telemetry(self, handle):
        return _TELEMETRY

    def release_xfer_handle(self, handle):
        return None


class _Telemetry:
    startTime, postDuration, xferDuration, totalBytes, descCount = 1, 20, 900, 1 << 20, 96


_TELEMETRY = _Telemetry()


def tap_own_cost(reads: int, rounds: int) -> None:
    """The tap's per-read cost on the engine's thread, on an agent that costs nothing."""
    writer = TraceWriter(tempfile.mkdtemp(), engine_id="bench", role="decode", rank=0)
    raw = _NullAgent()
    tap = AgentTap(raw, lambda read: writer.emit(_record, read))
    local = tap.prep_xfer_dlist("NIXL_INIT_AGENT", np.array([(0, BLOCK, 0, BLOCK, BLOCKS)], dtype=np.int64),
                                "DRAM")
    ids = np.arange(0, BLOCKS, 4, dtype=np.int32)

    def one(agent) -> None:
        handle = agent.make_prepped_xfer("READ", local, ids, None, ids, b"cmpl-bench-0:1")
        agent.transfer(handle)
        agent.check_xfer_state(handle)
        agent.check_xfer_state(handle)
        agent.get_xfer_telemetry(handle)
        agent.release_xfer_handle(handle)

    straight, tapped = [], []
    for _ in range(rounds):
        for agent, sink in ((raw, straight), (tap, tapped)):
            t = time.perf_counter()
            for _ in range(reads // rounds):
                tap.context = ("r", "bench-prefill", "p", 0, None)
                one(agent)
                tap.context = None
            sink.append((time.perf_counter() - t) / (reads // rounds))
        writer.flush()
    writer.close()
    base, traced = statistics.median(straight), statistics.median(tapped)
    print(f"1. the tap's own cost per read (null agent, the writer draining beside it): "
          f"{(traced - base) * 1e6:.2f} µs added ({base * 1e6:.2f} µs → {traced * 1e6:.2f} µs for the "
          f"six calls); {writer.written:,} records written, {writer.dropped} dropped")


def tap_overhead(reads: int, rounds: int) -> None:
    target, reader, remote_name, src, dst = _agents()
    writer_dir = tempfile.mkdtemp()
    writer = TraceWriter(writer_dir, engine_id="bench", role="decode", rank=0)

    def on_read(read: Read) -> None:
        writer.emit(_record, read)

    tap = AgentTap(reader, on_read)
    descs = np.array([(dst.ctypes.data, BLOCK, 0, BLOCK, BLOCKS)], dtype=np.int64)
    local = tap.prep_xfer_dlist("NIXL_INIT_AGENT", descs, "DRAM")
    src_list = np.array([(src.ctypes.data + i * BLOCK, BLOCK, 0) for i in range(BLOCKS)], dtype=np.int64)
    remote = reader.prep_xfer_dlist(remote_name, src_list, "DRAM")
    ids = np.arange(0, BLOCKS, 4, dtype=np.int32)  # 64 descriptors, as a small hybrid read
    notif = b"cmpl-bench-0:1"
    straight, tapped = [], []
    for _ in range(rounds):
        for agent, sink in ((reader, straight), (tap, tapped)):
            tap.context = ("r", "bench-prefill", "p", 0, None) if agent is tap else None
            spent = sum(_one_read(agent, reader, local, remote, ids, notif) for _ in range(reads // rounds))
            sink.append(spent / (reads // rounds))
    writer.close()
    base, traced = statistics.median(straight), statistics.median(tapped)
    print(f"1b. real NIXL calls per read (UCX loopback, noisy at this scale): stock {base * 1e6:.2f} µs, "
          f"through the tap {traced * 1e6:.2f} µs; "
          f"added {(traced - base) * 1e6:.2f} µs per read ({traced / base:.3f}x); "
          f"{writer.written} records written, {writer.dropped} dropped")
    del target


def _record(read: Read) -> dict:
    return records.transfer_record(
        request_id="r", engine_id="bench", remote_engine_id="bench-prefill", rank=0, tp_size=1,
        remote_rank=0, remote_tp_size=1, staging_bytes=0, **read_facts(read),
    )


def _facts(i: int) -> dict:
    return records.transfer_record(
        ts=1764400000.0 + i * 1e-3, request_id=f"cmpl-{i}", remote_request_id=f"p-{i}", engine_id="decode-0",
        remote_engine_id="prefill-0", rank=i % 4, tp_size=4, remote_rank=i % 4, remote_tp_size=4,
        status="ok", post_s=2.1e-5, xfer_s=1.3e-3, transported_bytes=1 << 20, descriptors=96,
        staging_bytes=0, groups=[{"group": 0, "kind": "attention", "blocks": 4, "bytes": 1 << 19,
                                  "descriptors": 64},
                                 {"group": 1, "kind": "mamba", "blocks": 1, "bytes": 1 << 19,
                                  "descriptors": 32}],
        groups_exact=True,
    )


def writer_throughput(count: int) -> None:
    """The writer's own pace: a queue of ``count`` records drained by its thread alone."""
    folder = Path(tempfile.mkdtemp())
    # baseline: the same records built, encoded and appended in a plain loop
    t = time.perf_counter()
    with open(folder / "plain.jsonl", "wb") as out:
        for i in range(count):
            out.write(_encode(_facts(i)))
    plain = time.perf_counter() - t
    writer = TraceWriter(folder / "traced", engine_id="decode-0", role="decode", rank=0,
                         queue_records=count + 1, flush_s=3600)
    wake = writer._wake.set
    writer._wake.set = lambda: None  # let the queue fill first: the drain is timed alone
    t = time.perf_counter()
    for i in range(count):
        writer.emit(_facts, i)
    emit = (time.perf_counter() - t) / count
    writer._wake.set = wake
    t = time.perf_counter()
    writer.close(timeout=600)
    drain = time.perf_counter() - t
    print(f"3. writer: {count / drain:,.0f} records/s on its thread ({drain:.2f} s for {count:,}); "
          f"plain build-encode-append loop {count / plain:,.0f}/s (writer/plain time "
          f"{drain / plain:.2f}x); emit {emit * 1e9:.0f} ns per record on the caller's thread; "
          f"{writer.written:,} written, {writer.dropped} dropped")


_TIMED = ("bind_connector_metadata", "start_load_kv", "wait_for_save", "get_transfer_results",
          "get_finished", "clear_connector_metadata")


def _timed_pair(harness, connector_cls, extra_config: dict):
    """A hybrid pair whose worker connectors' engine-thread calls are timed (both engines)."""
    pair = harness.make_pair("hybrid", connector_cls=connector_cls, extra_config=extra_config)
    spent = [0.0]
    for connector in (pair.decode, pair.prefill):
        for name in _TIMED:
            call = getattr(connector, name, None)
            if call is None:
                continue

            def timed(*args, _call=call, **kwargs):
                t = time.perf_counter()
                try:
                    return _call(*args, **kwargs)
                finally:
                    spent[0] += time.perf_counter() - t

            setattr(connector, name, timed)
    return pair, spent


def connector_overhead(reads: int, rounds: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "connector"))
    import vllm_harness as harness

    from hybridtrace.connector.vllm import NixlConnector as Traced

    trace = tempfile.mkdtemp()
    pairs = {"stock": _timed_pair(harness, None, {}),
             "traced": _timed_pair(harness, Traced, {"hybridtrace_dir": trace})}
    per_read: dict[str, list[float]] = {name: [] for name in pairs}
    counter = 0
    for name, (pair, _) in pairs.items():  # warm up: the handshake and first-use costs
        for _ in range(3):
            pair.transfer(f"warm-{name}-{counter}", num_tokens=100)
            counter += 1
    for _ in range(rounds):
        for name, (pair, spent) in pairs.items():
            spent[0] = 0.0
            for _ in range(reads // rounds):
                result = pair.transfer(f"r-{counter}", num_tokens=100)
                counter += 1
                assert result.ok
            per_read[name].append(spent[0] / (reads // rounds))
    for pair, _ in pairs.values():
        pair.close()
    written = sum(1 for part in Path(trace).glob("*.jsonl") for _ in part.open())
    base, traced = statistics.median(per_read["stock"]), statistics.median(per_read["traced"])
    print(f"2. whole connector, engine-thread time per read (worker calls on both engines): "
          f"stock {base * 1e6:.1f} µs, traced {traced * 1e6:.1f} µs; added {(traced - base) * 1e6:.1f} µs "
          f"({traced / base:.3f}x); {written} trace lines written")


def transfer_builder(count: int) -> None:
    """The writer's cost of one real ``transfer`` record: NIXL's facts plus the per-group
    split of a hybrid read (2 Mamba layers x 4 descriptors, 2 attention blocks x 4 regions)."""
    from hybridtrace.connector import vllm as traced

    trace = traced._WorkerTrace.__new__(traced._WorkerTrace)
    trace.engine_id, trace.rank, trace.tp_size, trace.remote_tp = "decode-0", 0, 1, {"prefill-0": 1}

    handle, regions = object(), [64] * 4
    lengths = np.full(sum(regions) + 64 * 8, 4096, dtype=np.int64)
    trace.worker = SimpleNamespace(use_host_buffer=False, _remote_agents={"prefill-0": {(0, 0): b"agent"}})
    trace.tap = SimpleNamespace(dlists={handle: lengths})
    trace.layout, trace.groups = (handle, regions, 64), [(0, "mamba", 1), (1, "attention", 1)]
    ids = np.array([r * 64 + b for r in range(4) for b in (3, 4)] + [256 + k * 64 + 10 for k in range(8)])
    read = Read(("r", "prefill-0", "p", 0, ([10], [3, 4])), handle, ids, b"p:1")
    read.state, read.post_ts, read.observed = "DONE", time.time(), time.time() + 1e-3
    read.telemetry = (1, 20, 900, int(lengths[ids].sum()), 10)
    t = time.perf_counter()
    for _ in range(count):
        _encode(trace._transfer(read))
    spent = (time.perf_counter() - t) / count
    print(f"3b. a hybrid read's transfer record with its group split: {spent * 1e6:.1f} µs to build and "
          f"encode ({1 / spent:,.0f} records/s on the writer's thread)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reads", type=int, default=20000)
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--connector-reads", type=int, default=400)
    args = parser.parse_args()
    tap_own_cost(args.reads * 10, args.rounds)
    tap_overhead(args.reads, args.rounds)
    connector_overhead(args.connector_reads, args.rounds)
    writer_throughput(args.records)
    transfer_builder(args.records // 10)


if __name__ == "__main__":
    main()
