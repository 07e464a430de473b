"""Findings from tiny hand-written connector traces, with the answers worked out by hand.

The worked example of every finding kind, each with its clean twin, is a diff-test case
under tests/cases/finding_<kind>/ (tests/test_view_cases.py runs them). The tests here are
the ones that build their traces in code: one prefill and one decode engine (NVIDIA
Nemotron Nano 12B v2, TP 4 on both sides, bf16 KV cache and bf16 conv + SSM state) and a
few request and transfer records, with the exact findings asserted.

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
import os
from dataclasses import dataclass

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
        # written long ago: a log that ends in a traceback is held back while it may still grow
        os.utime(folder / "vllm.log", (T0, T0))
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
