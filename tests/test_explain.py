"""`hybridtrace explain`: one handoff, by either id, with its findings."""

from __future__ import annotations

import pytest

from hybridtrace.analyze.explain import explain
from hybridtrace.errors import UsageError
from hybridtrace.ingest.run import ingest
from hybridtrace.simulate import SimOptions, simulate
from hybridtrace.store import Store


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    root = tmp_path_factory.mktemp("explain")
    simulate(SimOptions(seed=31, duration_s=20, inject={"padding_leak": 0.5, "kv_expired": 0.2}), root / "b")
    ingest([root / "b"], root / "s")
    return Store(root / "s").connect()


def test_explain_a_leaking_request_by_either_id(con):
    decode_id, prefill_id = con.sql(
        "SELECT r.request_id, r.remote_request_id FROM finding_padding_leak f "
        "JOIN requests r USING (engine_id, request_id) LIMIT 1"
    ).fetchall()[0]
    for rid in (decode_id, prefill_id):
        result = explain(con, rid)
        assert result["request"]["request_id"] == decode_id
        assert len(result["reads"]) == 2 and all(r["excess_bytes"] > 0 for r in result["reads"])
        assert [f["kind"] for f in result["findings"]] == ["padding_leak"]
        types = result["bytes_by_cache_type"]
        assert types["transported_state"] == types["reserved_state"] > types["expected_state"]
        assert types["transported_attention"] == types["expected_attention"]
        assert result["critical_path_s"] == max(r["xfer_s"] for r in result["reads"])


def test_explain_an_expired_request_shows_the_prefill_log_line(con):
    decode_id = con.sql("SELECT request_id FROM requests WHERE status = 'expired' LIMIT 1").fetchall()[0][0]
    result = explain(con, decode_id)
    assert any(e["kind"] == "kv_expired" for e in result["log_events"])
    assert "kv_expired" in [f["kind"] for f in result["findings"]]


def test_unknown_request_is_a_usage_error(con):
    with pytest.raises(UsageError, match="no request"):
        explain(con, "cmpl-nope")


def test_an_id_two_engines_used_needs_the_engine_and_failed_reads_move_nothing(tmp_path):
    # Request ids are unique per engine only: decode-0 and decode-1 both have cmpl-0-0. The
    # two handoffs are never summed; --engine picks one. On decode-1 rank 0's first read
    # failed and was retried: the bytes by cache type count the successful reads only.
    from tracegen import engine_record, transfer_records, write_jsonl

    records = [engine_record(e, "decode", 2) for e in ("decode-0", "decode-1")]
    records.append(engine_record("prefill-0", "prefill", 2))
    records += transfer_records(1, tp=2)
    again = [r | {"engine_id": "decode-1"} for r in transfer_records(1, tp=2)]
    failed = again[0] | {"status": "failed", "ts": again[0]["ts"] - 0.1}
    write_jsonl(tmp_path / "in" / "t.jsonl", records + again + [failed])
    ingest([tmp_path / "in"], tmp_path / "s", model="nemotron-nano-12b-v2")
    con = Store(tmp_path / "s").connect()
    with pytest.raises(UsageError, match=r"on 2 decode engines .*--engine"):
        explain(con, "cmpl-0-0")
    one = explain(con, "cmpl-0-0", engine_id="decode-0")
    other = explain(con, "cmpl-0-0", engine_id="decode-1")
    assert len(one["reads"]) == 2 and len(other["reads"]) == 3
    assert one["bytes_by_cache_type"] == other["bytes_by_cache_type"]
    assert one["bytes_by_cache_type"]["expected_attention"] > 0
    with pytest.raises(UsageError, match="no request 'cmpl-0-0' on decode-9"):
        explain(con, "cmpl-0-0", engine_id="decode-9")


def test_a_request_known_only_from_a_failure_line_is_found_by_either_id(tmp_path):
    # Logs only: the decode engine's failure line names the request on both sides.
    from loggen import vllm_line

    from hybridtrace.cli import app

    context = {"failure_type": "transfer_failed", "request_id": "cmpl-d-1", "engine_id": "decode-0",
               "remote_engine_id": "prefill-0", "remote_request_id": "cmpl-p-1"}  # fmt: skip
    folder = tmp_path / "in" / "decode-0"
    folder.mkdir(parents=True)
    (folder / "vllm.log").write_text("\n".join([
        vllm_line("Initializing NIXL worker decode-0", stamp="11-29 07:07:00"),
        vllm_line(f"NIXL transfer failure: transfer_failed. Marking blocks as invalid | Context: {context!r}",
                  level="ERROR", stamp="11-29 07:08:21", where="worker.py:505"),
    ]) + "\n")  # fmt: skip
    ingest([tmp_path / "in"], tmp_path / "s", year=2025)
    con = Store(tmp_path / "s").connect()
    for rid in ("cmpl-d-1", "cmpl-p-1"):
        assert [e["kind"] for e in explain(con, rid)["log_events"]] == ["transfer_failed"]
    from typer.testing import CliRunner

    shown = CliRunner().invoke(app, ["explain", "cmpl-p-1", "--store", str(tmp_path / "s")])
    assert shown.exit_code == 0, shown.output
    assert "no request record" in shown.output and "None" not in shown.output
