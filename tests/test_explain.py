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
