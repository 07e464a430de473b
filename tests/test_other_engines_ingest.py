"""TensorRT-LLM's transfer CSVs and SGLang's request stats through `ingest`: found by
content among other files, stored, and read again without a row or a manifest row more."""

from __future__ import annotations

from test_sglang import prefill_stats_newest, req_line
from test_trtllm import cpp_csv

from hybridtrace.ingest.run import ingest
from hybridtrace.store import Store


def test_other_engines_files_are_ingested_once(tmp_path):
    inputs = tmp_path / "in"
    (inputs / "ctx").mkdir(parents=True)
    csv = cpp_csv([(5, [(0.5, 2.0, 1048576)]), (6, [(0.1, 1.0, 9)])])
    (inputs / "ctx" / "rank_3_send.csv").write_bytes(csv)
    (inputs / "prefill-0").mkdir()
    log = "\n".join([
        "[2026-04-21 10:00:00 DP0 TP1] Prefill batch. #new-seq: 1",
        req_line("2026-04-21 10:00:01", " DP0 TP1", "r1", 11, 100, 1, "prefill",
                 prefill_stats_newest(614400, 0.004)),
    ]) + "\n"  # fmt: skip
    (inputs / "prefill-0" / "server.log").write_text(log)
    (inputs / "notes.txt").write_text("nothing here\n")
    store = tmp_path / "store"
    summary = ingest([inputs], store)
    assert summary.by_format == {"trtllm_csv": 1, "sglang": 1, "unknown": 1}

    def rows(sql: str) -> list[tuple]:
        return Store(store).connect().sql(sql).fetchall()

    assert rows("SELECT engine_id, request_id, rank, side FROM transfers ORDER BY engine_id, request_id") == [
        ("ctx", "5", 3, "send"), ("ctx", "6", 3, "send"), ("prefill-0_dp0", "r1", 1, "send")]
    assert rows("SELECT count(*) FROM rejects") == [(0,)]
    before = rows("SELECT count(*) FROM sources")
    ingest([inputs], store)
    assert rows("SELECT count(*) FROM sources") == before
    assert rows("SELECT count(*) FROM transfers") == [(3,)]
