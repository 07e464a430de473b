"""The trace v1 definition is the one source of truth: the ingester, validate, the simulator,
the test generator and the docs page all agree with it; and its extensions are read."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import storeread
from tracegen import dropped_record, engine_record, record, release_record, transfer_records, write_jsonl

from hybridtrace import trace_v1
from hybridtrace.ingest.run import ingest
from hybridtrace.ingest.trace import GROUP_FIELDS, fast_parse, looks_like_trace, parse_trace
from hybridtrace.schema import table_schema
from hybridtrace.store import Store

DOCS = Path(__file__).resolve().parent.parent / "docs" / "trace-format.md"
T0 = 1764400100.0


def test_importing_the_definition_loads_no_analysis_stack():
    # The connector imports it inside vLLM's processes, where none of these may be loaded.
    code = (
        "import json, sys, hybridtrace.trace_v1 as t; "
        "print(json.dumps([sorted(t.RECORD_TYPES), sorted({m.split('.')[0] for m in sys.modules})]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    types, modules = json.loads(out)
    assert types == ["dropped", "engine", "release", "request", "transfer"]
    assert not {"polars", "duckdb", "pyarrow", "altair", "numpy", "pandas"} & set(modules)


def test_the_docs_page_is_generated_from_the_definition():
    assert DOCS.read_text() == trace_v1.markdown(), "regenerate docs/trace-format.md from trace_v1.markdown()"


def test_the_definition_agrees_with_the_store_and_the_ingester():
    from hybridtrace.units import EPOCH_RANGE

    assert trace_v1.EPOCH_RANGE == EPOCH_RANGE  # one meaning of "epoch seconds" everywhere
    store_type = {"float64": "float64", "int64": "int64", "int32": "int32", "string": "string",
                  "bool": "bool", "groups": "json"}  # fmt: skip
    for rtype in trace_v1.RECORD_TYPES.values():
        columns = {c.name: c.type for c in table_schema(rtype.table).columns}
        for f in rtype.fields:
            if f.column is not None:
                assert columns.get(f.column) == store_type[f.type], (rtype.name, f.name)
        assert rtype.is_event == (rtype.table == "log_events")
    assert list(GROUP_FIELDS) == [g.name for g in trace_v1.GROUP_FIELDS]
    # every extension is optional: a contract v1 record stays valid
    for rtype in trace_v1.RECORD_TYPES.values():
        assert not [f.name for f in rtype.fields if f.extension and f.required and not rtype.extension]


def _with(item: dict, **changes: object) -> dict:
    """A generated record with ``changes``, its fields again in the definition's order."""
    return record(item["type"], **{k: v for k, v in item.items() if k not in ("type", "v")}, **changes)


def _good_records() -> list[dict]:
    return [
        engine_record("decode-0", "decode", 2, rank=1, pid=4242, hostname="node-7", agent_name="agent-d0-1",
                      use_host_buffer=False),
        *transfer_records(2),
        _with(transfer_records(1)[0], groups_exact=True, remote_agent_name="agent-p0-0",
              groups=[{"group": 0, "kind": "attention", "blocks": 1, "bytes": 5, "descriptors": 2}]),
        _with(transfer_records(1)[-1], external_request_id="cmpl-abc"),
        release_record("prefill-0", "p-cmpl-0-0", T0 + 30, rank=0, blocks=12, remote_engine_id="decode-0"),
        release_record("prefill-0", "p-cmpl-0-1", T0 + 31),
        dropped_record("decode-0", 17, T0 + 40, rank=1, pid=4242),
        dropped_record("decode-0", 0, T0 + 41),
    ]  # fmt: skip


_WRONG = {
    "float64": ["0.1", True, [1], {"a": 1}],
    "int64": [1.5, True, "3", [1]],
    "int32": [1.5, False, "0", 2**31, {"a": 1}],
    "string": [True, {"a": 1}, [1, 2]],
    "bool": [1, "true", 0.0],
    "groups": [{"group": 0}, "[]", 3],
}
_OUT_OF_RANGE = {"non_negative": [-1], "epoch": [T0 * 1000, 1.0], "tp_size": [0, -2], "rank": [-1, 99]}


def _bad_records() -> list[object]:
    """Every way a record of each type can fail, one fault each, and some in the top level."""
    bad: list[object] = [
        [1, 2], "text", 3, {"type": "transfer"}, {"v": 1}, {"v": 2, "type": "engine"},
        {"v": "1", "type": "engine"}, {"v": True, "type": "engine"}, {"v": 1, "type": "header"},
        {"v": 1, "type": 5},
    ]  # fmt: skip
    bases = {r["type"]: r for r in reversed(_good_records())}
    for name, rtype in trace_v1.RECORD_TYPES.items():
        base = bases[name]
        for f in rtype.fields:
            if f.required:
                bad.append({k: v for k, v in base.items() if k != f.name})
                bad.append({**base, f.name: None})
            bad += [{**base, f.name: value} for value in _WRONG[f.type]]
            if f.enum:
                bad.append({**base, f.name: "maybe"})
                bad.append({**base, f.name: 7})
            if f.range:
                bad += [{**base, f.name: value} for value in _OUT_OF_RANGE[f.range]]
        bad.append({**base, "ts": float("nan"), "rank": -5})  # two problems: the first is named
    return bad


def test_validate_names_what_the_ingester_rejects_and_accepts_what_it_reads():
    good, bad = _good_records(), _bad_records()
    for item in good:
        assert trace_v1.validate(item) == [], item
    lines = [json.dumps(item).encode() for item in [*good, *bad]]
    tables, rejects = parse_trace(duckdb.connect(), lines, 1, "src")
    reasons = dict(zip(rejects["line_number"].to_pylist(), rejects["reason"].to_pylist(), strict=True))
    read = sum(t.num_rows for t in tables.values())
    assert read == len(good) and len(reasons) == len(bad)
    for line, item in enumerate([*good, *bad], start=1):
        problems = trace_v1.validate(item)
        if line in reasons:
            assert problems and problems[0] == reasons[line], (item, reasons[line])
        else:
            assert problems == [], item
    # the fast path reads the good lines as the careful path does, and takes none of the bad
    fast = fast_parse(b"\n".join(lines[: len(good)]), 1, len(good), "src")
    assert fast is not None
    for name, table in tables.items():
        assert fast[name].to_pylist() == table.to_pylist(), name
    for item in bad:
        block = b"\n".join([*lines[: len(good)], json.dumps(item).encode()])
        assert fast_parse(block, 1, len(good) + 1, "src") is None, item


def test_validate_lists_every_problem_in_the_ingesters_order():
    item = {"type": "transfer", "v": 1, "ts": 1.0, "rank": "x", "tp_size": 0, "status": "maybe"}
    assert trace_v1.validate(item) == [
        "missing field request_id",
        "missing field engine_id",
        "missing field remote_engine_id",
        "wrong type for rank (want integer)",
        "missing field remote_rank",
        "missing field remote_tp_size",
        "missing field xfer_s",
        "missing field bytes",
        "unknown status maybe",
        "tp_size out of range: 0",
        "ts (epoch seconds) out of range: 1.0",
    ]


def test_the_new_record_types_are_a_trace():
    for item in (release_record("p", "r", T0), dropped_record("d", 1, T0)):
        assert looks_like_trace(json.dumps(item).encode() + b"\n")


def test_the_simulators_and_the_generators_records_are_valid(tmp_path):
    from hybridtrace.simulate import SimOptions, simulate

    injected = {"kv_expired": 0.05, "transfer_failed": 0.05}
    simulate(SimOptions(requests=300, seed=5, inject=injected), tmp_path / "b")
    traces = sorted((tmp_path / "b").rglob("trace.jsonl"))
    assert traces
    seen: set[str] = set()
    for path in traces:
        for line in path.read_text().splitlines():
            item = json.loads(line)
            assert trace_v1.validate(item) == [], line
            seen.add(item["type"])
            # the simulated connector is a stock one: it writes the contract's fields only
            rtype = trace_v1.record_type(item["type"])
            assert not [k for k in item if k in rtype.names and rtype.field(k).extension]
    assert seen == {"engine", "transfer", "request"}
    for item in [*transfer_records(5, tp=4, seed=2), engine_record("e", "prefill", 4), *_good_records()]:
        assert trace_v1.validate(item) == []
    with pytest.raises(ValueError, match="no field"):
        record("release", ts=T0, engine_id="p", request_id="r", status="ok")


def _events(store: Path) -> list[tuple]:
    con = Store(store).connect()
    return con.sql(
        "SELECT engine_id, process, rank, level, kind, request_id, remote_engine_id, message, details, "
        "event_hash, line_number FROM log_events ORDER BY line_number"
    ).fetchall()


def test_release_and_dropped_records_are_log_events_read_once(tmp_path):
    folder = tmp_path / "in" / "prefill-0"
    items = [
        engine_record("prefill-0", "prefill", 2, rank=0),
        release_record("prefill-0", "p-1", T0 + 30, rank=1, blocks=12, remote_engine_id="decode-0"),
        dropped_record("prefill-0", 17, T0 + 40, rank=1, pid=4242),
    ]
    write_jsonl(folder / "trace.jsonl", items)
    ingest([tmp_path / "in"], tmp_path / "s")
    (release, dropped) = _events(tmp_path / "s")
    assert release[:8] == (
        "prefill-0", "trace", 1, "WARNING", "kv_expired", "p-1", "decode-0",
        "released 12 KV blocks of request p-1 (expired): the lease ran out before the decoder read them",
    )  # fmt: skip
    assert json.loads(release[8]) == {k: v for k, v in items[1].items() if k not in ("type", "v")}
    assert dropped[:8] == ("prefill-0", "trace", 1, "WARNING", "trace_dropped", None, None,
                           "the trace writer dropped 17 records")  # fmt: skip
    assert json.loads(dropped[8])["records"] == 17
    before = _events(tmp_path / "s")
    # a rotated copy holds the same records: duplicates, nothing new
    raw = (folder / "trace.jsonl").read_bytes()
    (folder / "trace.jsonl.1.gz").write_bytes(gzip.compress(raw))
    summary = ingest([tmp_path / "in"], tmp_path / "s")
    assert summary.duplicates == 3 and _events(tmp_path / "s") == before
    # the careful path (a bad line in the chunk) gives the same rows and hashes
    write_jsonl(tmp_path / "other" / "p" / "trace.jsonl", [*items, {"type": "release", "v": 1}])
    ingest([tmp_path / "other"], tmp_path / "s2")
    assert _events(tmp_path / "s2") == before
    con = Store(tmp_path / "s2").connect()
    assert con.sql("SELECT reason FROM rejects").fetchall() == [("missing field ts",)]


def test_bad_release_and_dropped_records_are_rejects(tmp_path):
    items: list[dict] = [
        {"type": "release", "v": 1, "ts": T0, "engine_id": "p"},
        {"type": "release", "v": 1, "ts": T0, "engine_id": "p", "request_id": "r", "blocks": "12"},
        {"type": "release", "v": 1, "ts": T0, "engine_id": "p", "request_id": "r", "reason": "evicted"},
        {"type": "dropped", "v": 1, "ts": T0, "engine_id": "d"},
        {"type": "dropped", "v": 1, "ts": T0, "engine_id": "d", "records": 2.5},
        {"type": "dropped", "v": 1, "ts": T0, "engine_id": "d", "records": -3},
        {"type": "dropped", "v": 1, "ts": T0, "engine_id": ["d"], "records": 3},
    ]
    write_jsonl(tmp_path / "in" / "trace.jsonl", [release_record("p", "ok", T0), *items])
    ingest([tmp_path / "in"], tmp_path / "s")
    con = Store(tmp_path / "s").connect()
    reasons = [r for (r,) in con.sql("SELECT reason FROM rejects ORDER BY line_number").fetchall()]
    assert reasons == [
        "missing field request_id",
        "wrong type for blocks (want bigint)",
        "unknown reason evicted",
        "missing field records",
        "wrong type for records (want bigint)",
        "records out of range: -3",
        "wrong type for engine_id (want varchar)",
    ]
    assert reasons == [trace_v1.validate(item)[0] for item in items]
    assert con.sql("SELECT count(*) FROM log_events").fetchall() == [(1,)]


def test_an_engine_written_by_every_rank_is_one_engine(tmp_path):
    # Four TP ranks' processes each write their engine record, at the same time even; the
    # store keeps all four, and no view counts the engine four times.
    ranks = [
        engine_record("decode-0", "decode", 4, rank=r, pid=300 + r, hostname="node-1",
                      agent_name=f"agent-{r}")
        for r in range(4)
    ]  # fmt: skip
    write_jsonl(tmp_path / "in" / "decode-0" / "trace.jsonl", [*ranks, *transfer_records(3, tp=4)])
    write_jsonl(tmp_path / "one" / "decode-0" / "trace.jsonl",
                [engine_record("decode-0", "decode", 4), *transfer_records(3, tp=4)])  # fmt: skip
    from hybridtrace.analyze import analyze

    results = {}
    for name in ("in", "one"):
        ingest([tmp_path / name], tmp_path / f"s-{name}", model="nemotron-nano-12b-v2")
        con = Store(tmp_path / f"s-{name}").connect()
        views = {
            view: con.sql(f"SELECT * FROM {view} ORDER BY ALL").fetchall()
            for view in ("engine_models", "report_engines", "_engine_settings", "handoffs", "request_bytes")
        }
        results[name] = (views, analyze(con).findings)
    assert results["in"] == results["one"]
    con = Store(tmp_path / "s-in").connect()
    rows = con.sql("SELECT rank, pid, hostname, agent_name FROM engines ORDER BY rank").fetchall()
    assert rows == [(r, 300 + r, "node-1", f"agent-{r}") for r in range(4)]
    # a rotated copy of the same records adds nothing: the duplicates are found rank by rank
    raw = (tmp_path / "in" / "decode-0" / "trace.jsonl").read_bytes()
    (tmp_path / "in" / "decode-0" / "trace.jsonl.1.gz").write_bytes(gzip.compress(raw))
    assert ingest([tmp_path / "in"], tmp_path / "s-in").duplicates == 4 + 3 * 4 + 3
    assert storeread.rows(tmp_path / "s-in", "SELECT count(*) FROM engines") == [(4,)]


def test_a_store_from_before_engines_had_a_rank_takes_new_records(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    store = Store(tmp_path / "s")
    store.init()
    batch = "0" * 32
    old = pa.schema([f for f in table_schema("engines").arrow_schema() if f.name not in ("rank", "pid")])
    row = {f.name: None for f in old} | {"engine_id": "decode-0", "source_kind": "trace", "ts": 1764400000.0,
                                         "tp_size": 2, "role": "decode"}  # fmt: skip
    (tmp_path / "s" / "engines").mkdir()
    part = tmp_path / "s" / "engines" / f"part-{batch}.parquet"
    pq.write_table(pa.Table.from_pylist([row], schema=old), part)
    store.write_batch(batch, {}, table_schema("sources").arrow_schema().empty_table())
    records = [engine_record("decode-0", "decode", 2), engine_record("decode-0", "decode", 2, rank=1)]
    write_jsonl(tmp_path / "in" / "trace.jsonl", records)
    summary = ingest([tmp_path / "in"], tmp_path / "s")
    assert summary.duplicates == 1  # the rank-less record the store held already
    got = storeread.rows(tmp_path / "s", "SELECT rank FROM engines ORDER BY rank NULLS FIRST")
    assert got == [(None,), (1,)]


def test_the_analysis_says_how_many_records_the_writers_dropped(tmp_path):
    from hybridtrace.analyze import analyze

    items = [engine_record("decode-0", "decode", 2), *transfer_records(2)]
    write_jsonl(tmp_path / "in" / "a.jsonl", [*items, dropped_record("decode-0", 5, T0 + 60, rank=0)])
    write_jsonl(tmp_path / "in" / "b.jsonl", [dropped_record("decode-0", 7, T0 + 61, rank=1)])
    ingest([tmp_path / "in"], tmp_path / "s")
    assert analyze(Store(tmp_path / "s").connect()).inputs["trace_records_dropped"] == 12
    write_jsonl(tmp_path / "clean" / "a.jsonl", items)
    ingest([tmp_path / "clean"], tmp_path / "c")
    assert analyze(Store(tmp_path / "c").connect()).inputs["trace_records_dropped"] == 0


def test_extension_columns_reach_the_store(tmp_path):
    read = _with(transfer_records(1)[0], groups_exact=False, remote_agent_name="agent-p")
    asked = _with(transfer_records(1)[-1], external_request_id="cmpl-abc")
    write_jsonl(tmp_path / "in" / "trace.jsonl", [read, asked])
    ingest([tmp_path / "in"], tmp_path / "s")
    con = Store(tmp_path / "s").connect()
    assert con.sql("SELECT groups_exact, remote_agent_name FROM transfers").fetchall() == [(False, "agent-p")]
    assert con.sql("SELECT external_request_id FROM requests").fetchall() == [("cmpl-abc",)]
