"""Every finding kind from a tiny hand-written connector trace, with the answer worked out by hand.

Each scenario is one prefill and one decode engine (NVIDIA Nemotron Nano 12B v2, TP 4 on
both sides, bf16 KV cache and bf16 conv + SSM state) and a few request and transfer
records written literally below. The test asserts the exact findings (kind, engine,
request, rank, remote engine) and their evidence, then removes the fault and asserts
that the clean twin gives no finding at all.

Byte model, by hand (docs/byte-model.md rules on analyzer/model/configs/nemotron-nano-12b-v2.json),
per TP rank at TP 4:
  attention: 6 layers ('*' in hybrid_override_pattern); 8 KV heads / 4 = 2 heads per rank;
      2 × (128 K + 128 V) × 2 B = 1,024 B/token/layer  →  B = 6 × 1,024 = 6,144 B/token
  Mamba2: 28 layers; conv (4 − 1) × (128·80 + 2·8·128) / 4 × 2 B = 3 × 3,072 × 2 = 18,432 B/layer,
      SSM 128/4 heads × 80 × 128 × 2 B = 655,360 B/layer  →  one layer's page 673,792 B
      S = 28 × 673,792 = 18,866,176 B  (conv 516,096 + SSM 18,350,080)
  block: 16 × ceil(673,792 / (16 × 1,024)) = 16 × 42 = 672 tokens
  padded Mamba page: 672 × 1,024 = 688,128 B (+14,336 B, 2.13 %); 28 padded pages = 19,267,584 B
  groups of 6 layers: 1 attention group, ceil(28 / 6) = 5 Mamba groups = 30 slots → 2 padding layers
Cross-checked once against `hybridtrace model nemotron-nano-12b-v2 --tp 4 --kv-dtype bfloat16
--ssm-dtype bfloat16 --format json`: attention_bytes_per_token 6144, state_bytes 18866176,
block_tokens 672, mamba_padded_page_bytes 688128, padding_layers 2 (CONTRACT §2 shows the same).

One handoff: prompt 1,001 tokens, nothing cached → missing = 1001 − 1 − 0 = 1,000 = T; J = 1.
Per read (one decode rank's read from the same prefill rank):
  logical   = 6,144 × 1,000 + 18,866,176                  = 25,010,176
  expected  = ceil(1000/672) = 2 blocks → 2 × 672 × 6,144 = 8,257,536 attention
              + S 18,866,176                               = 27,123,712
  reserved  = 8,257,536 + 19,267,584 (28 padded pages)     = 27,525,120
  padding gap = reserved − expected = 28 × 14,336          = 401,408
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from hybridtrace.analyze import analyze
from hybridtrace.ingest.run import ingest
from hybridtrace.store import Store

MODEL = "nvidia/NVIDIA-Nemotron-Nano-12B-v2"
T0 = 1764400100.0  # 2025-11-29; all reads of a scenario fall in one 10-second window
RANKS = (0, 1, 2, 3)
# attention of one read: 2 blocks × 672 tokens × 6,144 B = 8,257,536 B
EXPECTED = 27_123_712  # 8,257,536 + S (18,866,176): what a correct read moves
RESERVED = 27_525_120  # 8,257,536 + 28 × 688,128: the state as padded allocator pages
GONE = {"transferred_tokens": 0, "reused_tokens": 0, "recomputed_tokens": 1001, "boundary_tokens": 0}


def engine(engine_id: str, role: str, **changes) -> dict:
    mamba = {"kind": "mamba", "layers": 6, "block_tokens": 672, "page_bytes": 688_128, "state_bytes": 673_792}
    record = {
        "type": "engine", "v": 1, "ts": T0 - 60, "engine_id": engine_id, "role": role, "model": MODEL,
        "tp_size": 4, "kv_cache_dtype": "bfloat16", "kv_buffer_device": "cuda", "kv_layout": "HND",
        "mamba_cache_dtype": "bfloat16", "mamba_ssm_cache_dtype": "bfloat16", "hybrid_allocator": True,
        "groups": [
            {"group": 0, "kind": "attention", "layers": 6, "padding_layers": 0, "block_tokens": 672,
             "page_bytes": 688_128},
            *[{"group": g, **mamba, "padding_layers": 0} for g in (1, 2, 3, 4)],
            {"group": 5, **mamba, "padding_layers": 2},  # 28 Mamba layers in 5 groups of 6
        ],
    }  # fmt: skip
    return record | changes


@dataclass(frozen=True)
class Pair:
    """One tiny deployment: engine prefill-<tag> (TP 4) serving decode-<tag> (TP 4)."""

    tag: str

    def engines(self, prefill: dict | None = None, decode: dict | None = None) -> list[dict]:
        return [engine(f"prefill-{self.tag}", "prefill", **(prefill or {})),
                engine(f"decode-{self.tag}", "decode", **(decode or {}))]  # fmt: skip

    def request(self, rid: str, ts: float, **changes) -> dict:
        """A clean handoff of 1,000 missing tokens, all reused; the decoder prefills the last token."""
        record = {
            "type": "request", "v": 1, "ts": ts + 0.2, "request_id": rid, "remote_request_id": f"p-{rid}",
            "engine_id": f"decode-{self.tag}", "remote_engine_id": f"prefill-{self.tag}",
            "prompt_tokens": 1001, "cached_tokens": 0, "missing_tokens": 1000, "transferred_tokens": 1000,
            "reused_tokens": 1000, "recomputed_tokens": 1, "state_blocks": 1, "boundary_tokens": 1000,
            "prefill_s": 0.1, "status": "ok",
        }  # fmt: skip
        return record | changes

    def read(self, rid: str, rank: int, ts: float, **changes) -> dict:
        """A clean read: 27,123,712 B in 5 ms (5.42 GB/s); 80 descriptors = 2 blocks × 6 layers
        × (K, V) + 28 layers × (conv, SSM)."""
        record = {
            "type": "transfer", "v": 1, "ts": ts + rank * 1e-4, "request_id": rid,
            "remote_request_id": f"p-{rid}", "engine_id": f"decode-{self.tag}",
            "remote_engine_id": f"prefill-{self.tag}", "rank": rank, "tp_size": 4, "remote_rank": rank,
            "remote_tp_size": 4, "status": "ok", "post_s": 0.0005, "xfer_s": 0.005, "bytes": EXPECTED,
            "descriptors": 80, "staging_bytes": 0, "link": "rdma:mlx5_0",
        }  # fmt: skip
        return record | changes

    def handoff(self, rid: str, **request_changes) -> list[dict]:
        """A clean request: four clean reads and its request record."""
        return [*[self.read(rid, k, T0) for k in RANKS], self.request(rid, T0, **request_changes)]


# --- the scenarios: records(fault) gives the faulty trace (True) or its clean twin (False) ---

PAD, SLOTS, STAGE, HOST, BND, CNT = (Pair(t) for t in ("pad", "slots", "stage", "host", "bnd", "cnt"))
SLOW, DESC, EXP, FAIL = (Pair(t) for t in ("slow", "desc", "exp", "fail"))
SHARD, CFG, BLK, RECO, STA = (Pair(t) for t in ("shard", "cfg", "blk", "reco", "sta"))
EXTRA, CONV = Pair("extra"), Pair("conv")
HOSTBUF, REL, RELA = Pair("hostbuf"), Pair("rel"), Pair("rela")


def padding_leak(fault: bool) -> list[dict]:
    # Every rank's state crossed as 28 padded pages: 27,525,120 B instead of 27,123,712.
    reads = [PAD.read("r-pad", k, T0, bytes=RESERVED if fault else EXPECTED) for k in RANKS]
    return [*PAD.engines(), *reads, PAD.request("r-pad", T0)]


def padding_layers(fault: bool) -> list[dict]:
    # The 2 padding layers of the last Mamba group crossed too: 30 padded pages per rank.
    # 8,257,536 + 1 × 30 × 688,128 (20,643,840) = 28,901,376 per read; reserved counts the 28 real
    # layers (27,525,120), and the padding layers' 2 pages (1,376,256) are sized apart.
    nbytes = 28_901_376 if fault else EXPECTED
    reads = [SLOTS.read("r-slots", k, T0, bytes=nbytes) for k in RANKS]
    return [*SLOTS.engines(), *reads, SLOTS.request("r-slots", T0)]


def staging_copy(fault: bool) -> list[dict]:
    # The decode engine registered its KV with a host buffer: each read was also copied
    # device↔host (staging_bytes = the payload); NIXL's bytes do not count the copy.
    device = {"kv_buffer_device": "cpu" if fault else "cuda"}
    reads = [STAGE.read("r-stage", k, T0, staging_bytes=EXPECTED if fault else 0) for k in RANKS]
    return [*STAGE.engines(decode=device), *reads, STAGE.request("r-stage", T0)]


def staging_counted(fault: bool) -> list[dict]:
    # As staging_copy, but NIXL's bytes count the copy too: each read reports 2 × 27,123,712.
    # The excess is the copy, not a rank pulling other ranks' state: no unsharded_state.
    device = {"kv_buffer_device": "cpu" if fault else "cuda"}
    reads = [CNT.read("r-cnt", k, T0, bytes=2 * EXPECTED if fault else EXPECTED,
                      staging_bytes=EXPECTED if fault else 0) for k in RANKS]  # fmt: skip
    return [*CNT.engines(decode=device), *reads, CNT.request("r-cnt", T0)]


def unexplained_excess(fault: bool) -> list[dict]:
    # Each read reports 4,000,000 B more than the payload, with no staging said and the KV on
    # the GPU: 31,123,712 > reserved 27,525,120 + the padding layers' 1,376,256 + 4,096 of slack,
    # and as state it would be 22,866,176 < 1.5 × 18,866,176, so not an unsharded pull.
    reads = [EXTRA.read("r-extra", k, T0, bytes=EXPECTED + 4_000_000 if fault else EXPECTED) for k in RANKS]
    return [*EXTRA.engines(), *reads, EXTRA.request("r-extra", T0)]


def cpu_buffer(fault: bool) -> list[dict]:
    # CONTRACT §6: a KV cache registered with kv_buffer_device cpu is a staging copy even when
    # the connector reports staging_bytes 0.
    return [*HOST.engines(decode={"kv_buffer_device": "cpu" if fault else "cuda"}), *HOST.handoff("r-host")]


def host_buffer_said(fault: bool) -> list[dict]:
    # Both twins register the KV cache with kv_buffer_device cpu; the trace says whether reads
    # go through a host staging buffer. On a CPU platform the cache is in host memory itself
    # and vLLM stages nothing (use_host_buffer false): the device alone is no staging copy.
    decode = {"kv_buffer_device": "cpu", "use_host_buffer": fault}
    return [*HOSTBUF.engines(decode=decode), *HOSTBUF.handoff("r-hostbuf")]


def release(pair: Pair, rid: str, rank: int) -> dict:
    """The prefill side's record of releasing a request's blocks (2 per layer) when the lease
    ran out; its request id is the decode side's remote_request_id."""
    return {
        "type": "release", "v": 1, "ts": T0 + 30, "engine_id": f"prefill-{pair.tag}",
        "request_id": f"p-{rid}", "rank": rank, "reason": "expired", "blocks": 2,
        "remote_engine_id": f"decode-{pair.tag}",
    }  # fmt: skip


def kv_expired_released(fault: bool) -> list[dict]:
    # As kv_expired, and every prefill rank also wrote its release record for the request:
    # the decode side's expiry and the prefill side's four releases are one finding.
    if not fault:
        return [*REL.engines(), *REL.handoff("r-rel")]
    reads = [REL.read("r-rel", k, T0, status="expired", bytes=0, xfer_s=0.001) for k in RANKS]
    releases = [release(REL, "r-rel", k) for k in RANKS]
    return [*REL.engines(), *reads, REL.request("r-rel", T0, status="expired", **GONE), *releases]


def release_alone(fault: bool) -> list[dict]:
    # The decode side recorded only that the handoff failed (no read, no expiry); the prefill
    # side's release record says why. It ties to the decode request by remote_request_id, as
    # an expiry log line does: a kv_expired finding beside the transfer_failed one.
    if not fault:
        return [*RELA.engines(), *RELA.handoff("r-rela")]
    failed = RELA.request("r-rela", T0, status="failed", **GONE)
    return [*RELA.engines(), failed, release(RELA, "r-rela", 0)]


def useless_boundary(fault: bool) -> list[dict]:
    # All 1,000 tokens crossed, but the state snapshot sits at the 672-token block boundary:
    # the decoder resumed at 672 and prefilled 1001 − 672 = 329 tokens itself.
    tokens = {"reused_tokens": 672, "recomputed_tokens": 329, "boundary_tokens": 672} if fault else {}
    return [*BND.engines(), *BND.handoff("r-bnd", **tokens)]


def state_alone(fault: bool) -> list[dict]:
    # Each rank received the state snapshot for token 1,000 (18,866,176 B) but no attention
    # block: the state cannot be resumed from, and the decoder prefilled all 1,001 tokens.
    if not fault:
        return [*STA.engines(), *STA.handoff("r-sta")]
    reads = [STA.read("r-sta", k, T0, bytes=18_866_176) for k in RANKS]
    lost = {"transferred_tokens": 0, "reused_tokens": 0, "recomputed_tokens": 1001}
    return [*STA.engines(), *reads, STA.request("r-sta", T0, **lost)]


def slow_rank(fault: bool) -> list[dict]:
    # Three handoffs in one window; rank 2 takes 20 ms where its peers take 5 ms:
    # 27,123,712 / 0.020 = 1.3561856 GB/s against 27,123,712 / 0.005 = 5.4247424 GB/s (ratio 0.25 < 0.6).
    records = SLOW.engines()
    for i, rid in enumerate(("r-s1", "r-s2", "r-s3")):
        ts = T0 + i
        records += [SLOW.read(rid, k, ts, xfer_s=0.020 if fault and k == 2 else 0.005) for k in RANKS]
        records.append(SLOW.request(rid, ts))
    return records


def descriptor_bound(fault: bool) -> list[dict]:
    # The read was cut into 4 KiB descriptors: 27,123,712 / 4,096 = 6,622 per read, and posting
    # them took 4 of the read's 5 ms (share 0.8 ≥ 0.5).
    shape = {"descriptors": 6622, "post_s": 0.004} if fault else {}
    reads = [DESC.read("r-desc", k, T0, **shape) for k in RANKS]
    return [*DESC.engines(), *reads, DESC.request("r-desc", T0)]


def kv_expired(fault: bool) -> list[dict]:
    # The prefill engine released the blocks first: every read expired with nothing moved,
    # and the decoder prefilled the whole prompt.
    if not fault:
        return [*EXP.engines(), *EXP.handoff("r-exp")]
    reads = [EXP.read("r-exp", k, T0, status="expired", bytes=0, xfer_s=0.001) for k in RANKS]
    return [*EXP.engines(), *reads, EXP.request("r-exp", T0, status="expired", **GONE)]


def transfer_failed(fault: bool) -> list[dict]:
    # Rank 3's read failed; no token arrived whole, so the decoder prefilled all 1,001.
    if not fault:
        return [*FAIL.engines(), *FAIL.handoff("r-fail")]
    reads = [FAIL.read("r-fail", k, T0) for k in (0, 1, 2)]
    reads.append(FAIL.read("r-fail", 3, T0, status="failed", bytes=0))
    return [*FAIL.engines(), *reads, FAIL.request("r-fail", T0, status="failed", **GONE)]


def unsharded_state(fault: bool) -> list[dict]:
    # Rank 1 pulled every rank's state shard: 8,257,536 + 4 × 18,866,176 = 83,722,240 B.
    reads = [SHARD.read("r-shard", k, T0, bytes=83_722_240 if fault and k == 1 else EXPECTED) for k in RANKS]
    return [*SHARD.engines(), *reads, SHARD.request("r-shard", T0)]


def config_mismatch(fault: bool) -> list[dict]:
    # The prefill engine runs an fp8 KV cache, the decoder bfloat16.
    return [*CFG.engines(prefill={"kv_cache_dtype": "fp8"} if fault else None), *CFG.handoff("r-cfg")]


def conv_dtype_mismatch(fault: bool) -> list[dict]:
    # The prefill engine keeps its conv state in float32, the decoder in bfloat16: the conv
    # pages differ in size, so the state cannot be read across as it lies.
    prefill = {"mamba_cache_dtype": "float32"} if fault else None
    return [*CONV.engines(prefill=prefill), *CONV.handoff("r-conv")]


def block_size_mismatch(fault: bool) -> list[dict]:
    # The prefill engine keeps vLLM's float32 SSM default: its Mamba page is 18,432 + 1,310,720
    # = 1,329,152 B, so its attention block is 16 × ceil(1,329,152 / 16,384) = 1,312 tokens against
    # the decoder's 672 (CONTRACT §6 lists block size among config_mismatch's settings).
    # padded page 1,312 × 1,024 = 1,343,488 B; the same 1 + 5 groups of 6 layers
    page = {"block_tokens": 1312, "page_bytes": 1_343_488}
    groups = [{"group": 0, "kind": "attention", "layers": 6, "padding_layers": 0, **page},
              *[{"group": g, "kind": "mamba", "layers": 6, "padding_layers": 2 if g == 5 else 0, **page,
                 "state_bytes": 1_329_152} for g in (1, 2, 3, 4, 5)]]  # fmt: skip
    prefill = {"mamba_ssm_cache_dtype": "float32", "groups": groups} if fault else None
    return [*BLK.engines(prefill=prefill), *BLK.handoff("r-blk")]


def recompute_cheaper(fault: bool) -> list[dict]:
    # The reads fell back to TCP: the slowest (rank 2) took 160 ms; the decoder prefills the
    # same 1,000 tokens in 100 ms (measured), so 0.16 > 0.1 × margin 1.0.
    xfer = (0.14, 0.15, 0.16, 0.13) if fault else (0.005,) * 4
    link = "tcp" if fault else "rdma:mlx5_0"
    reads = [RECO.read("r-reco", k, T0, xfer_s=xfer[k], link=link) for k in RANKS]
    return [*RECO.engines(), *reads, RECO.request("r-reco", T0)]


@dataclass(frozen=True)
class Scenario:
    records: Callable[[bool], list[dict]]
    findings: list[tuple]  # (kind, engine_id, request_id, rank, remote_engine_id), in analyze's order
    evidence: dict  # the first finding's evidence
    exact: bool = True  # evidence must be exactly this dict (else: these keys at least)


SCENARIOS = {
    # 4 reads × 27,525,120 = 110,100,480 transported = reserved; expected 4 × 27,123,712 = 108,494,848;
    # excess = padding gap = 4 × 401,408 = 1,605,632.
    "padding_leak": Scenario(padding_leak, [("padding_leak", "decode-pad", "r-pad", None, "prefill-pad")], {
        "reads": 4, "transported_bytes": 110_100_480, "expected_bytes": 108_494_848,
        "reserved_bytes": 110_100_480, "excess_bytes": 1_605_632, "padding_gap_bytes": 1_605_632,
        "padding_layers_bytes": 5_505_024, "how": "state sent as padded pages"}),
    # 4 × 28,901,376 = 115,605,504 transported; excess 4 × 1,777,664 = 7,110,656 = the padding gap
    # of the 28 real layers (4 × 401,408) + the 2 padding layers' pages (4 × 2 × 688,128 = 5,505,024).
    "padding_leak/padding_layers": Scenario(
        padding_layers, [("padding_leak", "decode-slots", "r-slots", None, "prefill-slots")], {
        "reads": 4, "transported_bytes": 115_605_504, "expected_bytes": 108_494_848,
        "reserved_bytes": 110_100_480, "excess_bytes": 7_110_656, "padding_gap_bytes": 1_605_632,
        "padding_layers_bytes": 5_505_024, "how": "state sent as padded pages, padding layers included"}),
    # staged 4 × 27,123,712 = 108,494,848; transported 108,494,848 ≤ reserved 110,100,480: not counted.
    "staging_copy": Scenario(
        staging_copy, [("staging_copy", "decode-stage", "r-stage", None, "prefill-stage")], {
        "reads": 4, "staging_bytes": 108_494_848, "transported_bytes": 108_494_848,
        "reserved_bytes": 110_100_480, "padding_layers_bytes": 5_505_024,
        "host_buffer_engines": ["decode-stage"], "copies_counted_in_transport": False}),
    # transported 4 × 54,247,424 = 216,989,696 > reserved 110,100,480 + the padding layers'
    # pages 4 × 1,376,256: the copies are counted.
    "staging_copy/counted": Scenario(
        staging_counted, [("staging_copy", "decode-cnt", "r-cnt", None, "prefill-cnt")], {
        "reads": 4, "staging_bytes": 108_494_848, "transported_bytes": 216_989_696,
        "reserved_bytes": 110_100_480, "padding_layers_bytes": 5_505_024,
        "host_buffer_engines": ["decode-cnt"], "copies_counted_in_transport": True}),
    # 4 × 31,123,712 = 124,494,848 transported against 4 × 27,525,120 = 110,100,480 reserved.
    "staging_copy/unexplained": Scenario(
        unexplained_excess, [("staging_copy", "decode-extra", "r-extra", None, "prefill-extra")], {
        "reads": 4, "staging_bytes": 0, "transported_bytes": 124_494_848, "reserved_bytes": 110_100_480,
        "padding_layers_bytes": 5_505_024, "host_buffer_engines": [], "copies_counted_in_transport": True}),
    "staging_copy/cpu_buffer": Scenario(
        cpu_buffer, [("staging_copy", "decode-host", "r-host", None, "prefill-host")], {
        "reads": 4, "transported_bytes": 108_494_848, "copies_counted_in_transport": False}, exact=False),
    # as cpu_buffer, but the trace says use_host_buffer true; its clean twin says false
    "staging_copy/use_host_buffer": Scenario(
        host_buffer_said, [("staging_copy", "decode-hostbuf", "r-hostbuf", None, "prefill-hostbuf")], {
        "reads": 4, "staging_bytes": 0, "transported_bytes": 108_494_848, "reserved_bytes": 110_100_480,
        "padding_layers_bytes": 5_505_024, "host_buffer_engines": ["decode-hostbuf"],
        "copies_counted_in_transport": False}),
    "useless_boundary": Scenario(
        useless_boundary, [("useless_boundary", "decode-bnd", "r-bnd", None, "prefill-bnd")], {
        "transferred_tokens": 1000, "reused_tokens": 672, "recomputed_tokens": 329, "boundary_tokens": 672,
        "cached_tokens": 0}),
    "useless_boundary/state_alone": Scenario(
        state_alone, [("useless_boundary", "decode-sta", "r-sta", None, "prefill-sta")], {
        "transferred_tokens": 0, "reused_tokens": 0, "recomputed_tokens": 1001, "boundary_tokens": 1000,
        "cached_tokens": 0}),
    # 3 reads per rank in the window; critical path: rank 2 was the slowest read of all 3 requests.
    "slow_rank": Scenario(slow_rank, [("slow_rank", "decode-slow", None, 2, None)], {
        "median_gb_s": 1.3561856, "peer_median_gb_s": 5.4247424, "slow_windows": 1, "windows": 1,
        "critical_path_share": 1.0}),
    # 4 × 6,622 = 26,488 descriptors; post 4 × 0.004 = 0.016 s of xfer 4 × 0.005 = 0.02 s;
    # 108,494,848 / 26,488 = 4,096 B per descriptor.
    "descriptor_bound": Scenario(
        descriptor_bound, [("descriptor_bound", "decode-desc", "r-desc", None, "prefill-desc")], {
        "reads": 4, "descriptors": 26_488, "post_s": 0.016, "xfer_s": 0.02, "bytes_per_descriptor": 4096}),
    "kv_expired": Scenario(kv_expired, [("kv_expired", "decode-exp", "r-exp", None, "prefill-exp")], {
        "sources": ["trace"]}),
    "kv_expired/released": Scenario(
        kv_expired_released, [("kv_expired", "decode-rel", "r-rel", None, "prefill-rel")], {
        "sources": ["trace"]}),
    "kv_expired/release_alone": Scenario(
        release_alone, [("kv_expired", "decode-rela", "r-rela", None, "prefill-rela"),
                        ("transfer_failed", "decode-rela", "r-rela", None, "prefill-rela")], {
        "sources": ["trace"]}),
    "transfer_failed": Scenario(
        transfer_failed, [("transfer_failed", "decode-fail", "r-fail", 3, "prefill-fail")], {
        "source": "trace", "reads": 1}),
    # rank 1 moved 83,722,240 − 8,257,536 = 75,464,704 B of state (S at TP 1) ≥ 1.5 × 18,866,176;
    # excess 83,722,240 − 27,123,712 = 56,598,528 is not the 401,408 padding gap.
    "unsharded_state": Scenario(
        unsharded_state, [("unsharded_state", "decode-shard", "r-shard", 1, "prefill-shard")], {
        "reads": 1, "state_bytes_moved": 75_464_704, "state_shard_bytes": 18_866_176, "share": 1}),
    "config_mismatch": Scenario(
        config_mismatch, [("config_mismatch", "decode-cfg", None, None, "prefill-cfg")], {
        "differs": ["KV dtype bfloat16 vs fp8"],
        "decode_kv_cache_dtype": "bfloat16", "prefill_kv_cache_dtype": "fp8", "decode_kv_layout": "HND",
        "prefill_kv_layout": "HND", "decode_block_tokens": 672, "prefill_block_tokens": 672,
        "decode_mamba_cache_dtype": "bfloat16", "prefill_mamba_cache_dtype": "bfloat16",
        "decode_mamba_ssm_cache_dtype": "bfloat16", "prefill_mamba_ssm_cache_dtype": "bfloat16",
        "decode_mamba_cache_mode": None, "prefill_mamba_cache_mode": None,
        "decode_tp_size": 4, "prefill_tp_size": 4, "handshake_mismatches": 0}),
    "config_mismatch/block_size": Scenario(
        block_size_mismatch, [("config_mismatch", "decode-blk", None, None, "prefill-blk")], {
        "differs": ["block size 672 vs 1312 tokens", "SSM state dtype bfloat16 vs float32"],
        "decode_block_tokens": 672, "prefill_block_tokens": 1312}, exact=False),
    "config_mismatch/conv_dtype": Scenario(
        conv_dtype_mismatch, [("config_mismatch", "decode-conv", None, None, "prefill-conv")], {
        "differs": ["conv state dtype bfloat16 vs float32"],
        "decode_mamba_cache_dtype": "bfloat16", "prefill_mamba_cache_dtype": "float32"}, exact=False),
    "recompute_cheaper": Scenario(
        recompute_cheaper, [("recompute_cheaper", "decode-reco", "r-reco", None, "prefill-reco")], {
        "critical_path_s": 0.16, "prefill_s": 0.1, "prefill": "measured", "missing_tokens": 1000,
        "slowest_rank": 2}),
}  # fmt: skip



@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[bool, Path]:
    """Two stores: every scenario's faulty trace (True), and every clean twin (False).

    Each scenario is its own engine pair and every rule is scoped to an engine, a request or
    an engine pair, so the scenarios cannot see each other; one store each keeps the test fast.
    """
    root = tmp_path_factory.mktemp("by-hand")
    for fault in (True, False):
        for name, scenario in SCENARIOS.items():
            folder = root / str(fault) / name.replace("/", "-")
            folder.mkdir(parents=True)
            records = scenario.records(fault)
            (folder / "connector.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        ingest([root / str(fault)], root / f"store-{fault}", model="nemotron-nano-12b-v2")
    return {fault: root / f"store-{fault}" for fault in (True, False)}


@pytest.fixture(scope="module")
def findings(stores) -> dict[bool, list[dict]]:
    return {fault: analyze(Store(path).connect()).findings for fault, path in stores.items()}


def key(finding: dict) -> tuple:
    return tuple(finding[k] for k in ("kind", "engine_id", "request_id", "rank", "remote_engine_id"))


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_finding_by_hand(findings, name):
    scenario = SCENARIOS[name]
    kind, decode_engine = scenario.findings[0][:2]
    found = [f for f in findings[True] if f["engine_id"] == decode_engine]
    assert [key(f) for f in found] == scenario.findings
    evidence = found[0]["evidence"]
    if not scenario.exact:
        evidence = {k: evidence.get(k) for k in scenario.evidence}
    # byte counts and labels compare exactly; seconds and GB/s up to float noise
    expected = {k: pytest.approx(v, rel=1e-12) if isinstance(v, float) else v
                for k, v in scenario.evidence.items()}  # fmt: skip
    assert evidence == expected
    clean = [f for f in findings[False] if f["engine_id"] == decode_engine]
    assert [f for f in clean if f["kind"] == kind] == []
    assert clean == [], "the clean twin should give no finding of any kind"


def test_nothing_beyond_the_scenarios(findings):
    # No finding outside the listed ones in the faulty store; none at all among the clean twins.
    listed = {finding for scenario in SCENARIOS.values() for finding in scenario.findings}
    assert {key(f) for f in findings[True]} <= listed
    assert findings[False] == []


def test_the_store_sizes_the_engines_as_worked_out_by_hand(stores):
    # Guards the hand figures above: the analyzer measures every read against these.
    rows = Store(stores[False]).connect().sql(
        "SELECT DISTINCT attention_bytes_per_token, state_bytes, block_tokens, mamba_padded_page_bytes, "
        "recurrent_layers, padding_layers FROM engine_models"
    ).fetchall()
    assert rows == [(6144, 18_866_176, 672, 688_128, 28, 2)]


def test_failed_reads_move_nothing_they_had_to_and_a_failed_request_is_a_failure(tmp_path):
    pair = Pair("more")
    records = [*pair.engines(), *pair.handoff("r-retry")]
    # rank 0's first read failed before the one that went through
    records.append(pair.read("r-retry", 0, T0 - 1, status="failed", bytes=0))
    # the request record says the transfer failed, though no read says which rank
    records += pair.handoff("r-said", status="failed", **GONE)
    path = tmp_path / "in" / "decode-more" / "trace.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    ingest([tmp_path / "in"], tmp_path / "s", model="nemotron-nano-12b-v2")
    con = Store(tmp_path / "s").connect()
    got = con.sql(
        "SELECT reads, expected_bytes, transported_bytes, excess_bytes FROM request_bytes "
        "WHERE request_id = 'r-retry'"
    ).fetchall()
    assert got == [(5, 4 * EXPECTED, 4 * EXPECTED, 0)]
    failures = [(f["request_id"], f["rank"]) for f in analyze(con).findings if f["kind"] == "transfer_failed"]
    assert failures == [("r-retry", 0), ("r-said", None)]


def test_reads_without_a_token_count_are_not_inputs_of_the_byte_rules(tmp_path):
    pair = Pair("untold")
    records = [*pair.engines(), *pair.handoff("r-told"), *pair.handoff("r-untold")]
    del records[-1]["transferred_tokens"]  # the second request does not say what crossed
    path = tmp_path / "in" / "decode-untold" / "trace.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    ingest([tmp_path / "in"], tmp_path / "s", model="nemotron-nano-12b-v2")
    result = analyze(Store(tmp_path / "s").connect())
    assert result.summary["rules"]["padding_leak"]["inputs"] == 4  # r-told's four reads
    assert result.summary["transported_over_expected"] == 1.0  # over the same four reads


def test_a_failure_or_expiry_named_twice_is_one_finding_on_the_right_request(tmp_path):
    # decode-e1 read "x" and "y" from prefill-e1 too late (expired reads); decode-e2 read
    # its own "x" from prefill-e2 fine; both prefill-side ids of x are p-x. Only prefill-e1
    # logged an expiry (of p-x), and its counter went 0 → 2: the reads name y. So one
    # kv_expired for each of decode-e1's x and y, none for decode-e2's x, and no
    # engine-level "counted but not named". decode-e1's r-f failed: its record says so and
    # a failure line names rank 0, which is one failure, on rank 0.
    from loggen import vllm_line
    from promgen import scrape

    one, two = Pair("e1"), Pair("e2")
    expired = [one.read(rid, k, T0, status="expired", bytes=0) for k in RANKS for rid in ("x", "y")]
    records = [*one.engines(), *two.engines(), *expired, one.request("x", T0, status="recomputed", **GONE),
               one.request("y", T0, status="recomputed", **GONE),
               *two.handoff("x"), one.request("r-f", T0 + 1, status="failed", **GONE)]  # fmt: skip
    path = tmp_path / "in" / "decode-e1" / "trace.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    context = {"failure_type": "transfer_failed", "request_id": "r-f", "engine_id": "decode-e1",
               "remote_engine_id": "prefill-e1", "remote_request_id": "p-r-f"}  # fmt: skip
    (tmp_path / "in" / "decode-e1" / "vllm.log").write_text("\n".join([
        vllm_line("Initializing NIXL worker decode-e1", stamp="11-29 07:07:00"),
        vllm_line(f"NIXL transfer failure: transfer_failed. Marking blocks as invalid | Context: {context!r}",
                  level="ERROR", stamp="11-29 07:08:21", where="worker.py:505"),
    ]) + "\n")  # fmt: skip
    prefill = tmp_path / "in" / "prefill-e1"
    prefill.mkdir()
    (prefill / "vllm.log").write_text("\n".join([
        vllm_line("Initializing NIXL worker prefill-e1", stamp="11-29 07:07:00"),
        vllm_line("Releasing expired KV blocks for request p-x which were retrieved by 0 decode worker(s) "
                  "within 480 seconds.", level="WARNING", stamp="11-29 07:16:20",
                  where="base_worker.py:2152"),
    ]) + "\n")  # fmt: skip
    stamp_ms = int(T0 * 1000)
    (prefill / "metrics-1.prom").write_text(scrape([], expired=0, timestamp_ms=stamp_ms))
    (prefill / "metrics-2.prom").write_text(scrape([], expired=2, timestamp_ms=stamp_ms + 600_000))
    ingest([tmp_path / "in"], tmp_path / "s", model="nemotron-nano-12b-v2", year=2025)
    found = sorted(
        ((f["kind"], f["engine_id"], f["request_id"], f["rank"])
         for f in analyze(Store(tmp_path / "s").connect()).findings
         if f["kind"] in ("kv_expired", "transfer_failed")),
        key=str,
    )  # fmt: skip
    assert found == [("kv_expired", "decode-e1", "x", None), ("kv_expired", "decode-e1", "y", None),
                     ("transfer_failed", "decode-e1", "r-f", 0)]  # fmt: skip


def test_unsharded_state_reads_the_state_from_the_groups_when_the_trace_has_them(tmp_path):
    # r-att: each read carries 5 attention blocks (20,643,840 B) where 2 were needed, and
    # exactly its state shard (18,866,176 B): extra attention is not state, so no
    # unsharded_state (before the groups were read, 31,252,480 B counted as "state").
    # r-all: rank 1's mamba groups moved every rank's shard (4 × 18,866,176): that one is.
    pair = Pair("att")

    def grouped(rid: str, rank: int, attention: int, state: int) -> dict:
        groups = [{"group": 0, "kind": "attention", "blocks": attention // 4_128_768, "bytes": attention},
                  {"group": 1, "kind": "mamba", "blocks": 1, "bytes": state}]  # fmt: skip
        return pair.read(rid, rank, T0, bytes=attention + state, groups=groups)

    records = [*pair.engines(), pair.request("r-att", T0), pair.request("r-all", T0)]
    records += [grouped("r-att", k, 20_643_840, 18_866_176) for k in RANKS]
    records += [grouped("r-all", k, 8_257_536, 4 * 18_866_176 if k == 1 else 18_866_176) for k in RANKS]
    path = tmp_path / "in" / "decode-att" / "trace.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    ingest([tmp_path / "in"], tmp_path / "s", model="nemotron-nano-12b-v2")
    findings = analyze(Store(tmp_path / "s").connect()).findings
    unsharded = [f for f in findings if f["kind"] == "unsharded_state"]
    assert [(f["request_id"], f["rank"], f["evidence"]["state_bytes_moved"]) for f in unsharded] == [
        ("r-all", 1, 75_464_704)
    ]


def test_a_failed_handshake_is_a_config_mismatch_even_when_no_read_happened(tmp_path):
    # decode-h1's handshake with prefill-h1 failed on the compatibility hash: no read, only
    # a failed request record naming the pair, and the traceback (no remote id). decode-h2
    # logged a mismatch and nothing else names its peer: a finding with the peer unknown.
    from loggen import vllm_line

    pair = Pair("h1")
    records = [*pair.engines(), pair.request("r-h", T0, status="failed", **GONE)]
    path = tmp_path / "in" / "decode-h1" / "trace.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    traceback = ('Traceback (most recent call last):\n  File "worker.py", line 434, in _nixl_handshake\n'
                 "RuntimeError: NIXL compatibility hash mismatch. Local: 7a1c0e, Remote: 93bd42")  # fmt: skip
    for engine in ("decode-h1", "decode-h2"):
        folder = tmp_path / "in" / engine
        folder.mkdir(exist_ok=True)
        (folder / "vllm.log").write_text("\n".join([
            vllm_line(f"Initializing NIXL worker {engine}", stamp="11-29 07:07:00"),
            vllm_line(traceback, level="ERROR", stamp="11-29 07:08:21", where="worker.py:434"),
        ]) + "\n")  # fmt: skip
    ingest([tmp_path / "in"], tmp_path / "s", model="nemotron-nano-12b-v2", year=2025)
    result = analyze(Store(tmp_path / "s").connect())
    found = sorted(
        (f["engine_id"], f["remote_engine_id"] or "", f["evidence"]["handshake_mismatches"])
        for f in result.findings if f["kind"] == "config_mismatch"
    )  # fmt: skip
    assert found == [("decode-h1", "prefill-h1", 1), ("decode-h2", "", 1)]
    assert result.summary["rules"]["config_mismatch"]["inputs"] == 2


def test_staged_reads_whose_excess_is_padding_layers_do_not_count_the_copies(tmp_path):
    # A host-buffer decode engine whose reads also carried the padding layers' pages: 4 ×
    # 28,901,376 = 115,605,504 transported, above reserved (110,100,480) by exactly those
    # pages (4 × 1,376,256). That is a padding leak, not the staging copies in NIXL's bytes.
    pair = Pair("stpad")
    reads = [pair.read("r-sp", k, T0, bytes=28_901_376, staging_bytes=EXPECTED) for k in RANKS]
    records = [*pair.engines(decode={"kv_buffer_device": "cpu"}), *reads, pair.request("r-sp", T0)]
    path = tmp_path / "in" / "decode-stpad" / "trace.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    ingest([tmp_path / "in"], tmp_path / "s", model="nemotron-nano-12b-v2")
    findings = {f["kind"]: f for f in analyze(Store(tmp_path / "s").connect()).findings}
    assert sorted(findings) == ["padding_leak", "staging_copy"]
    how = findings["padding_leak"]["evidence"]["how"]
    assert how == "state sent as padded pages, padding layers included"
    assert findings["staging_copy"]["evidence"]["copies_counted_in_transport"] is False
