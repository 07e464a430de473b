"""The fitted link on real NIXL: loopback READs over UCX, fitted as the analysis fits them.

Two NIXL agents in this process (host memory, UCX over TCP on loopback) move READs of
several sizes, each at two descriptor sizes, so that the same bytes cross as few large
descriptors or many small ones (the only way a per-descriptor cost can be told from the
bandwidth). Every READ's time, bytes and descriptor count are NIXL's own
(``get_xfer_telemetry``); ``hybridtrace.analyze.link_fit.fit_link`` fits them. Loopback on
a shared two-core machine is noisy: the figures are reported, run by run, not checked.

    python benchmarks/link_fit_real.py [--runs 3] [--reads 240]

Needs NIXL (``pip install --no-deps nixl==1.5.1 nixl-cu13==1.5.1`` beside vLLM, or
``nixl-cu12==1.5.1`` with numpy) and ``UCX_TLS=tcp,self`` on a machine without RDMA.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("UCX_TLS", "tcp,self")

import numpy as np
import polars as pl

from hybridtrace.analyze.link_fit import fit_link

SMALL, LARGE = 4096, 65536  # descriptor sizes
BUFFER = 64 << 20
SIZES = (256 << 10, 1 << 20, 4 << 20, 8 << 20)  # bytes of one READ


def _pair(name: str):
    from nixl._api import nixl_agent, nixl_agent_config

    config = nixl_agent_config(backends=["UCX"], capture_telemetry=True)  # each READ's own telemetry
    target, reader = (nixl_agent(f"{name}-{side}", config) for side in ("target", "reader"))
    src = np.random.default_rng(1).integers(0, 255, BUFFER, dtype=np.uint8)
    dst = np.zeros_like(src)
    target.register_memory(target.get_reg_descs([(src.ctypes.data, src.nbytes, 0, "")], "DRAM"))
    reader.register_memory(reader.get_reg_descs([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM"))
    remote = reader.add_remote_agent(target.get_agent_metadata())
    lists = {}
    for block in (SMALL, LARGE):
        count = BUFFER // block
        local = np.array([(dst.ctypes.data + i * block, block, 0) for i in range(count)], dtype=np.int64)
        far = np.array([(src.ctypes.data + i * block, block, 0) for i in range(count)], dtype=np.int64)
        lists[block] = (reader.prep_xfer_dlist("NIXL_INIT_AGENT", local, "DRAM"),
                        reader.prep_xfer_dlist(remote, far, "DRAM"))  # fmt: skip
    return target, reader, lists, (src, dst)


def _read(reader, lists, block: int, nbytes: int) -> tuple[float, int, int]:
    local, far = lists[block]
    # every other block: NIXL merges contiguous descriptors, and the count is what it posts
    ids = np.arange(0, 2 * (nbytes // block), 2, dtype=np.int32)
    handle = reader.make_prepped_xfer("READ", local, ids, far, ids, b"")
    state = reader.transfer(handle)
    while state == "PROC":
        state = reader.check_xfer_state(handle)
    if state != "DONE":
        raise RuntimeError(f"READ ended {state}")
    t = reader.get_xfer_telemetry(handle)
    reader.release_xfer_handle(handle)
    return t.xferDuration / 1e6, t.totalBytes, t.descCount


def run(reads: int, seed: int) -> dict:
    target, reader, lists, keep = _pair(f"fit{seed}")
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(5):  # warm the connection up: the first reads set up UCX's endpoints
        _read(reader, lists, LARGE, SIZES[0])
    for _ in range(reads):
        block = int(rng.choice([SMALL, LARGE]))
        nbytes = int(rng.choice(SIZES))
        xfer_s, moved, descriptors = _read(reader, lists, block, nbytes)
        rows.append({"xfer_s": xfer_s, "bytes": moved, "descriptors": descriptors})
    del target  # the target agent lives until its reads are done
    del keep
    frame = pl.DataFrame(rows)
    fit = fit_link(frame)
    assert fit is not None
    return {"reads": frame.height, "fit": fit}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--reads", type=int, default=240)
    args = parser.parse_args()
    print(f"{'run':>3} {'reads':>6} {'fixed (ms)':>11} {'bandwidth (MB/s)':>17} {'per descriptor (µs)':>20} "
          f"{'median error':>13}")  # fmt: skip
    for seed in range(1, args.runs + 1):
        start = time.perf_counter()
        result = run(args.reads, seed)
        fit = result["fit"]
        bandwidth = f"{fit.bandwidth_bytes_per_s / 1e6:17.1f}" if fit.bandwidth_bytes_per_s else f"{'-':>17}"
        per_desc = f"{fit.per_descriptor_s * 1e6:20.2f}" if fit.per_descriptor_s is not None else f"{'-':>20}"
        print(f"{seed:>3} {result['reads']:>6} {fit.fixed_s * 1e3:11.3f} {bandwidth} {per_desc} "
              f"{fit.median_abs_error_pct:12.1f}%  ({time.perf_counter() - start:.1f} s){'  ' + fit.note if fit.note else ''}")  # fmt: skip  # noqa: E501


if __name__ == "__main__":
    main()
