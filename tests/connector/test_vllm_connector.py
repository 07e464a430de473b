"""hybridtrace's NixlConnector on real vLLM 0.33 workers moving real blocks over real NIXL.

A prefill and a decode engine (worker and scheduler halves each, vLLM's own code) move
requests of an attention-only and a hybrid (Mamba2 + attention) model. The trace they
write must ingest with no rejects and say, read by read, exactly the bytes the test
moved; its engine records must size the caches as ``hybridtrace model`` does; and
``analyze`` must raise the injected faults (a read NIXL rejected, a lease that ran out)
and nothing else the test cannot derive from the config and the bytes it moved.

The byte figures are worked from the tiny models' shapes (see test_vllm_harness_smoke):
attention: 2 layers × K/V × 2 heads × 16 dims × 2 B = 256 B per token; hybrid state:
conv 3 × 96 bf16 + SSM 4 × 16 × 16 fp32 = 4,672 B per Mamba layer, on an 8,192 B page.
"""

from __future__ import annotations

import inspect
import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import vllm_harness as harness

from hybridtrace.analyze import analyze
from hybridtrace.connector import writer
from hybridtrace.connector.tap import AgentTap
from hybridtrace.connector.vllm import HOOKED, NixlConnector, external_request_id
from hybridtrace.ingest.run import ingest
from hybridtrace.store import Store
from hybridtrace.trace_v1 import validate

pytestmark = pytest.mark.connector

B_PER_TOKEN = 256  # both models: 2 attention layers
STATE_PER_LAYER = 4672
MAMBA_LAYERS = 2
TIMING_KINDS = {"slow_rank", "descriptor_bound", "recompute_cheaper"}
# vLLM's internal ids are the API's id plus "-" and 8 random characters
SUFFIX = "-0a1b2c3d"


@dataclass
class Run:
    kind: str
    pair: harness.Pair
    ok: list[harness.TransferResult]
    failed: harness.TransferResult
    lease: harness.LeaseResult
    late: harness.TransferResult
    trace: Path
    store: Path
    config: Path


@pytest.fixture(scope="module", params=["attention", "hybrid"])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    kind = request.param
    trace = tmp_path_factory.mktemp(f"trace-{kind}")
    pair = harness.make_pair(kind, connector_cls=NixlConnector, extra_config={"hybridtrace_dir": str(trace)})
    try:
        ok = []
        for i, n in enumerate((40, 100, 160)):
            decode_id = f"cmpl-{kind}-{i}{SUFFIX}"
            result = pair.transfer(f"{kind}-{i}", num_tokens=n, seed=i, decode_request_id=decode_id)
            # checked before the next request may reuse the blocks
            assert result.ok and pair.decode_matches(result), result
            ok.append(result)
        failed = pair.transfer_failing(f"{kind}-fail", num_tokens=70,
                                       decode_request_id=f"cmpl-{kind}-f{SUFFIX}")
        lease = pair.expire_lease(f"{kind}-lease", num_tokens=50)
        late = _read_after_the_lease(pair, f"{kind}-late", num_tokens=60,
                                     decode_request_id=f"cmpl-{kind}-late{SUFFIX}")
        assert failed.failed and lease.released and late.received
    finally:
        pair.close()  # shuts the connectors down: every trace file is flushed and closed
    config = harness._model_dir(kind) / "config.json"
    store = tmp_path_factory.mktemp(f"store-{kind}")
    ingest([trace, config], store, model=str(config))
    yield Run(kind, pair, ok, failed, lease, late, trace, store, config)


def _read_after_the_lease(pair: harness.Pair, request_id: str, **transfer: object) -> harness.TransferResult:
    """A router that holds the request until the prefill has released its blocks: the
    decode then reads blocks the prefill no longer keeps (NIXL still moves them)."""
    engine = pair.prefill_engine

    def shorten(metadata) -> None:
        if request_id in metadata.reqs_to_send:
            metadata.reqs_to_send[request_id] = metadata.scheduler_clock + 0.2

    def hold(params: dict) -> None:
        for _ in range(2000):
            if request_id in engine.step().finished_sending:
                return
            time.sleep(0.005)
        raise TimeoutError(f"the prefill kept {request_id} past its lease")

    engine.metadata_hooks.append(shorten)
    try:
        return pair.transfer(request_id, tamper=hold, wait_for_send=False, **transfer)
    finally:
        engine.metadata_hooks.remove(shorten)


def _sql(run: Run, query: str) -> list[dict]:
    con = Store(run.store).connect()
    cursor = con.execute(query)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _records(run: Run) -> list[dict]:
    lines = []
    for part in sorted(run.trace.glob("*.jsonl")):
        lines += [json.loads(line) for line in part.read_text().splitlines()]
    return lines


def test_the_trace_is_valid_and_ingests_without_rejects(run: Run) -> None:
    files = sorted(p.name for p in run.trace.glob("*.jsonl"))
    # a worker per engine and the decode's scheduler; the prefill's scheduler has nothing to say
    assert [f.split(".pid")[0] for f in files] == ["decode-0.decode.sched", "decode-0.decode.tp0",
                                                    "prefill-0.prefill.tp0"]
    records = _records(run)
    assert [problem for r in records for problem in validate(r)] == []
    assert _sql(run, "SELECT count(*) AS n FROM rejects") == [{"n": 0}]
    kinds = {r["type"] for r in records}
    assert kinds == {"engine", "transfer", "request", "release"}


def test_each_read_reports_the_bytes_that_moved(run: Run) -> None:
    rows = _sql(run, """
        SELECT t.request_id, t.rank, t.remote_rank, t.status, t.transported_bytes, t.descriptors,
               t.groups, t.groups_exact, b.transported_bytes AS accounted
        FROM transfers t LEFT JOIN transfer_bytes b USING (engine_id, request_id, rank, remote_rank, ts)
        ORDER BY t.request_id""")
    by_request = {r["request_id"]: r for r in rows}
    assert len(rows) == len(run.ok) + 2  # one read per request at TP 1, the failed and late ones included
    for result in run.ok:
        read = by_request[result.decode_request_id]
        moved = harness.expected_read_bytes(run.pair, result.decode_blocks)
        assert (read["rank"], read["remote_rank"], read["status"]) == (0, 0, "ok")
        assert read["transported_bytes"] == moved == result.nixl_bytes
        assert read["accounted"] == moved
        assert read["descriptors"] == result.nixl_descriptors
        # per group: what the blocks hold, the Mamba state unpadded; and it adds up
        groups = {g["kind"]: g for g in json.loads(read["groups"])}
        assert read["groups_exact"] is True
        attention_blocks = len(result.decode_blocks[-1])
        assert groups["attention"]["blocks"] == attention_blocks
        assert groups["attention"]["bytes"] == attention_blocks * run.pair.block_size * B_PER_TOKEN
        if run.kind == "hybrid":
            assert groups["mamba"]["blocks"] == len(result.decode_blocks[0]) == 1
            assert groups["mamba"]["bytes"] == MAMBA_LAYERS * STATE_PER_LAYER
            # three conv sub-projections and the SSM state, per Mamba layer
            assert groups["mamba"]["descriptors"] == 4 * MAMBA_LAYERS
        assert sum(g["bytes"] for g in groups.values()) == moved
    failed = by_request[run.failed.decode_request_id]
    assert (failed["status"], failed["transported_bytes"]) == ("failed", 0)


def test_request_bytes_sum_the_reads_and_requests_say_what_the_scheduler_saw(run: Run) -> None:
    rows = {r["request_id"]: r for r in _sql(run, "SELECT * FROM request_bytes")}
    requests = {r["request_id"]: r for r in _sql(run, "SELECT * FROM requests")}
    assert set(requests) == {r.decode_request_id for r in [*run.ok, run.failed, run.late]}
    for result in run.ok:
        assert rows[result.decode_request_id]["transported_bytes"] == result.nixl_bytes
        record = requests[result.decode_request_id]
        prompt = result.num_tokens
        assert record["prompt_tokens"] == prompt and record["cached_tokens"] == 0
        assert record["remote_request_id"] == result.request_id
        assert record["remote_engine_id"] == "prefill-0" and record["status"] == "ok"
        assert record["external_request_id"] == result.decode_request_id.removesuffix(SUFFIX)
        # what was asked is what the prefill computed: vLLM leaves the last token to the
        # decoder when the model has recurrent state (it rebuilds the state from it)
        asked = result.kv_transfer_params["remote_num_tokens"] if run.kind == "hybrid" else prompt
        assert record["missing_tokens"] == record["transferred_tokens"] == asked
        assert record["recomputed_tokens"] == prompt - asked
        assert record["state_blocks"] == (1 if run.kind == "hybrid" else 0)
        # the attention blocks read cover what was asked, whole
        assert len(result.decode_blocks[-1]) == math.ceil(asked / run.pair.block_size)
    assert requests[run.failed.decode_request_id]["status"] == "failed"
    assert requests[run.failed.decode_request_id]["transferred_tokens"] is None


def test_engine_records_size_the_caches_as_the_byte_model_does(run: Run) -> None:
    # vLLM's CPU attention kernel takes blocks in multiples of 32 tokens (GPU kernels: 16)
    model = json.loads(subprocess.run(
        [sys.executable, "-m", "hybridtrace", "model", str(run.config), "--tp", "1", "--block-align", "32",
         "--format", "json"],
        capture_output=True, text=True, check=True).stdout)
    engines = _sql(run, "SELECT engine_id, role, rank, tp_size, agent_name, kv_buffer_device, "
                        "use_host_buffer, groups FROM engines ORDER BY engine_id")
    assert [(e["engine_id"], e["role"], e["rank"], e["tp_size"]) for e in engines] == [
        ("decode-0", "decode", 0, 1), ("prefill-0", "prefill", 0, 1)]
    for engine in engines:
        # on a CPU platform the cache is host memory itself: no staging buffer
        assert (engine["kv_buffer_device"], engine["use_host_buffer"]) == ("cpu", False)
        assert engine["agent_name"]
        groups = {g["kind"]: g for g in json.loads(engine["groups"])}
        attention = groups["attention"]
        per_token_layer = model["attention_bytes_per_token_per_layer"]
        assert attention["page_bytes"] == attention["block_tokens"] * per_token_layer
        assert attention["layers"] == model["attention_layers"]
        if run.kind == "hybrid":
            assert attention["block_tokens"] == model["block_tokens"] == 64
            assert attention["page_bytes"] == model["attention_page_bytes"]
            mamba = groups["mamba"]
            assert mamba["state_bytes"] == model["mamba_page_bytes"] == STATE_PER_LAYER
            assert mamba["page_bytes"] == model["mamba_padded_page_bytes"]
            assert mamba["layers"] == model["recurrent_layers"]
            assert mamba["padding_layers"] == model["kv_cache_groups"]["padding_layers"] == 0
    # the agent names are the NIXL agents' own (NIXL names its telemetry files after them)
    agents = {r["engine_id"]: r["agent_name"] for r in _records(run) if r["type"] == "engine"}
    assert agents["decode-0"] == run.pair.decode.connector_worker.nixl_wrapper.name


def test_analyze_raises_the_injected_faults_and_nothing_else(run: Run) -> None:
    con = Store(run.store).connect()
    found = {
        (f["kind"], f["engine_id"], f["request_id"])
        for f in analyze(con).findings if f["kind"] not in TIMING_KINDS
    }
    # Derived from the config and the bytes moved, independently of the analyzer: every
    # successful read moved whole attention blocks of what was asked plus one unpadded
    # state per Mamba layer, which is what a correct connector moves: no byte finding.
    for result in run.ok:
        asked = result.kv_transfer_params.get("remote_num_tokens", result.num_tokens)
        blocks = math.ceil(asked / run.pair.block_size)
        expected = blocks * run.pair.block_size * B_PER_TOKEN
        if run.kind == "hybrid":
            expected += MAMBA_LAYERS * STATE_PER_LAYER
        assert result.nixl_bytes == expected
    assert found == {
        ("transfer_failed", "decode-0", run.failed.decode_request_id),
        ("kv_expired", "prefill-0", run.lease.request_id),  # released, and no decoder asked
        # read after the prefill had released it: tied to the decode request by the release
        ("kv_expired", "decode-0", run.late.decode_request_id),
    }


def test_the_hooked_internals_are_there() -> None:
    """Fails, loudly, when a vLLM release moves what the connector reads or wraps."""
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler import NixlPullConnectorScheduler
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import NixlPullConnectorWorker

    pair = harness.make_pair("attention", connector_cls=NixlConnector,
                             extra_config={"hybridtrace_dir": "/nonexistent/never-written"})
    try:
        worker = pair.decode.connector_worker
        assert [name for name in HOOKED["worker"] if not hasattr(worker, name)] == []
        assert isinstance(worker.nixl_wrapper, AgentTap)
        scheduler = pair.decode_scheduler.connector_scheduler
        assert [name for name in HOOKED["scheduler"] if not hasattr(scheduler, name)] == []
    finally:
        pair.close()
    read = inspect.signature(NixlPullConnectorWorker._read_blocks).parameters
    assert {"read_spec", "dst_engine_id", "request_id", "remote_request_id"} <= set(read)
    assert list(inspect.signature(NixlPullConnectorScheduler.get_num_new_matched_tokens).parameters) == [
        "self", "request", "num_computed_tokens"]


def test_without_a_folder_it_is_the_stock_connector(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HYBRIDTRACE_TRACE_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    with harness.make_pair("hybrid", connector_cls=NixlConnector) as pair:
        assert pair.decode._trace_worker is None and pair.decode_scheduler._trace_scheduler is None
        assert not isinstance(pair.decode.connector_worker.nixl_wrapper, AgentTap)
        result = pair.transfer("plain-0", num_tokens=100)
        assert result.ok and pair.decode_matches(result)
    assert list(tmp_path.rglob("*.jsonl")) == []


def test_external_request_id() -> None:
    assert external_request_id("cmpl-abc-0a1b2c3d") == "cmpl-abc"
    assert external_request_id("plain") is None


def test_a_failing_hook_never_reaches_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from hybridtrace.connector import vllm as traced

    def broken(self, read) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(traced._WorkerTrace, "_read_done", broken)
    monkeypatch.setattr(writer, "_said", set())  # "once" is per process: start this test afresh
    with caplog.at_level("WARNING", logger="hybridtrace.connector"), harness.make_pair(
        "hybrid", connector_cls=NixlConnector, extra_config={"hybridtrace_dir": str(tmp_path)}
    ) as pair:
        for i in range(2):
            result = pair.transfer(f"boom-{i}", num_tokens=100)
            assert result.ok and pair.decode_matches(result)
    said = [m for m in caplog.messages if "could not be queued" in m]
    assert len(said) == 1  # once, however many reads
    lines = [json.loads(line) for p in tmp_path.glob("*.jsonl") for line in p.read_text().splitlines()]
    assert not [r for r in lines if r["type"] == "transfer"]
    assert [r["type"] for r in lines if r["type"] == "request"] == ["request", "request"]


def test_without_the_read_hook_the_nixl_calls_still_tell_a_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Another vLLM whose read-posting method is gone: said once; bytes, descriptors,
    status and the remote request id still come from the NIXL calls."""
    from hybridtrace.connector import vllm as traced

    monkeypatch.setattr(writer, "_said", set())
    monkeypatch.setattr(traced, "HOOKED", {**HOOKED, "worker": (*HOOKED["worker"], "_gone_in_this_release")})
    monkeypatch.setattr(traced._WorkerTrace, "_wrap_read", lambda self, read_blocks: read_blocks)
    with caplog.at_level("WARNING", logger="hybridtrace.connector"), harness.make_pair(
        "attention", connector_cls=NixlConnector, extra_config={"hybridtrace_dir": str(tmp_path)}
    ) as pair:
        result = pair.transfer("nohook-0", num_tokens=100)
        assert result.ok
    assert sum("_gone_in_this_release" in m for m in caplog.messages) == 1  # once per process
    lines = [json.loads(line) for p in tmp_path.glob("*.jsonl") for line in p.read_text().splitlines()]
    (read,) = [r for r in lines if r["type"] == "transfer"]
    assert read["bytes"] == result.nixl_bytes and read["descriptors"] == result.nixl_descriptors
    assert read["status"] == "ok" and read["remote_request_id"] == "nohook-0"
    assert read["request_id"] is None  # not guessed: ingest rejects it as incomplete
    assert validate(read) != []


def test_vllm_resolves_the_documented_flag_to_this_connector() -> None:
    """The flag users are told to set, read by vLLM's own factory, names this class."""
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    flag = json.loads(
        '{"kv_connector":"NixlConnector","kv_connector_module_path":"hybridtrace.connector.vllm",'
        '"kv_role":"kv_both","kv_connector_extra_config":{"hybridtrace_dir":"/var/log/hybridtrace"}}'
    )
    assert KVConnectorFactory.get_connector_class(KVTransferConfig(**flag)) is NixlConnector
    assert KVConnectorFactory.supports_hma_config(KVTransferConfig(**flag))
