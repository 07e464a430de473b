"""Connector trace ingest: counts, incremental re-runs, duplicates, bad input, crashes."""

from __future__ import annotations

import gzip
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import storeread
from storefaults import kill_writes
from tracegen import engine_record, transfer_records, write_jsonl

from hybridtrace.ingest.run import ingest
from hybridtrace.store import Store

NEMOTRON = Path(__file__).parent.parent / "analyzer" / "model" / "configs" / "nemotron-nano-12b-v2.json"


def counts(store: Path) -> dict[str, int]:
    return {
        t: storeread.rows(store, f"SELECT count(*) FROM {t}")[0][0]
        for t in ("transfers", "requests", "engines", "rejects", "models")
    }


def bundle(root: Path, n: int = 20) -> Path:
    write_jsonl(
        root / "decode-0" / "trace.jsonl", [engine_record("decode-0", "decode", 2), *transfer_records(n)]
    )
    (root / "model").mkdir(parents=True)
    (root / "model" / "config.json").write_text(NEMOTRON.read_text())
    (root / "notes.txt").write_text("nothing to see here\n")
    return root


def test_ingest_counts_and_query(tmp_path):
    data = bundle(tmp_path / "in", n=20)
    summary = ingest([data], tmp_path / "store")
    assert counts(tmp_path / "store") == {
        "transfers": 40,
        "requests": 20,
        "engines": 1,
        "rejects": 0,
        "models": 1,
    }
    assert summary.by_format == {"connector_trace": 1, "model_config": 1, "unknown": 1}
    con = Store(tmp_path / "store").connect()
    rows = con.sql("SELECT rank, reads, transported_bytes FROM rank_bandwidth ORDER BY rank").fetchall()
    expected = sum(r["bytes"] for r in transfer_records(20) if r["type"] == "transfer" and r["rank"] == 0)
    assert rows[0] == (0, 20, expected)
    # the unrecognised file is in the manifest, not an error
    status = dict(con.sql("SELECT regexp_extract(uri, '[^/]+$'), status FROM sources").fetchall())
    assert status["notes.txt"] == "unrecognised"


def test_values_no_deployment_has_are_rejects(tmp_path):
    from hybridtrace.ingest.trace import fast_parse

    good = [r for r in transfer_records(2) if r["type"] == "transfer"]
    bad = [
        {**good[0], "ts": good[0]["ts"] * 1000},  # milliseconds
        {**good[0], "ts": 1e300},
        {**good[0], "bytes": -1},
        {**good[0], "post_s": -0.001},
        {**good[0], "xfer_s": -0.5},
    ]
    # the bulk checks send every one of them to the careful path, which says what is wrong
    def lines(records: list[dict]) -> bytes:
        return "".join(json.dumps(r) + "\n" for r in records).encode()

    assert fast_parse(lines(good), 1, len(good), "s") is not None
    for record in bad:
        assert fast_parse(lines([*good, record]), 1, len(good) + 1, "s") is None
    write_jsonl(tmp_path / "in" / "d" / "trace.jsonl", [*good, *bad])
    ingest([tmp_path / "in"], tmp_path / "store")
    con = Store(tmp_path / "store").connect()
    assert con.sql("SELECT count(*) FROM transfers").fetchall() == [(len(good),)]
    reasons = [r for (r,) in con.sql("SELECT reason FROM rejects ORDER BY line_number").fetchall()]
    assert reasons == [
        f"ts (epoch seconds) out of range: {bad[0]['ts']:.1f}",
        "ts (epoch seconds) out of range: 1e+300",
        "bytes out of range: -1",
        "post_s out of range: -0.001",
        "xfer_s out of range: -0.5",
    ]


def test_a_trace_that_starts_with_a_cut_record_is_still_a_trace(tmp_path):
    records = [json.dumps(r) for r in transfer_records(2)]
    folder = tmp_path / "in"
    folder.mkdir()
    cut = records[0][len(records[0]) // 2 :]
    text_version = records[1].replace('"v": 1', '"v": "1"')
    lines = [cut, '{"type": "header", "v": 1}', text_version, *records[2:]]
    (folder / "trace.jsonl.1").write_text("\n".join(lines) + "\n")
    ingest([folder], tmp_path / "store")
    con = Store(tmp_path / "store").connect()
    assert con.sql("SELECT line_number, reason FROM rejects ORDER BY 1").fetchall() == [
        (1, "not valid JSON"),
        (2, "unknown record type header"),
        (3, 'unsupported trace version "1"'),
    ]
    assert con.sql("SELECT count(*) FROM transfers").fetchall()[0][0] + con.sql(
        "SELECT count(*) FROM requests"
    ).fetchall()[0][0] == len(records) - 2


def test_a_byte_order_mark_before_the_first_record_is_not_a_reject(tmp_path):
    records = transfer_records(2)
    folder = tmp_path / "in"
    folder.mkdir()
    body = "".join(json.dumps(r) + "\n" for r in records).encode()
    (folder / "trace.jsonl").write_bytes(b"\xef\xbb\xbf" + body)
    ingest([folder], tmp_path / "store")
    assert counts(tmp_path / "store")["rejects"] == 0
    assert counts(tmp_path / "store")["transfers"] + counts(tmp_path / "store")["requests"] == len(records)


def test_rerun_skips_unchanged_and_appends_are_read_once(tmp_path):
    data = bundle(tmp_path / "in", n=10)
    store = tmp_path / "store"
    ingest([data], store)
    before = counts(store)
    again = ingest([data], store)
    assert again.objects_skipped == 3 and again.objects_read == 0
    assert counts(store) == before
    # a growing trace: only the appended records are read
    trace = data / "decode-0" / "trace.jsonl"
    more = transfer_records(5, seed=7, start_ts=1764409000.0)
    with open(trace, "a") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in more))
    summary = ingest([data], store)
    assert summary.rows["transfers"] == 10 and summary.duplicates == 0
    assert counts(store)["transfers"] == before["transfers"] + 10
    lines = storeread.rows(store, "SELECT max(line_number) FROM transfers")[0][0]
    assert lines == 1 + 10 * 3 + 5 * 3 - 1  # line numbers keep counting across appends


def test_rotated_gzip_copy_adds_no_duplicates(tmp_path):
    data = bundle(tmp_path / "in", n=10)
    store = tmp_path / "store"
    ingest([data], store)
    before = counts(store)
    raw = (data / "decode-0" / "trace.jsonl").read_bytes()
    (data / "decode-0" / "trace.jsonl.1.gz").write_bytes(gzip.compress(raw))
    summary = ingest([data], store)
    assert summary.duplicates == 31  # 20 transfers + 10 requests + 1 engine, all already held
    assert counts(store) == before
    # the copy's manifest row says it added nothing, and why
    copy = storeread.rows(store,
        "SELECT rows, duplicates FROM sources WHERE uri LIKE '%trace.jsonl.1.gz'"
    )
    assert [(json.loads(r), d) for r, d in copy] == [({"transfers": 0, "requests": 0, "engines": 0}, 31)]


def test_a_line_repeated_in_one_file_counts_once_in_its_rows(tmp_path):
    records = transfer_records(3)
    path = tmp_path / "in" / "trace.jsonl"
    path.parent.mkdir()
    lines = [json.dumps(r) for r in records]
    path.write_text("\n".join([*lines, lines[0]]) + "\n")
    summary = ingest([tmp_path / "in"], tmp_path / "store")
    manifest = Store(tmp_path / "store").connect().sql("SELECT rows, duplicates FROM sources")
    ((rows, duplicates),) = manifest.fetchall()
    written = counts(tmp_path / "store")
    assert duplicates == summary.duplicates == 1
    assert {k: v for k, v in json.loads(rows).items() if v} == {k: v for k, v in written.items() if v}


def test_bad_input_ends_in_rejects_and_sources(tmp_path):
    good = transfer_records(3)
    lines = [json.dumps(r) for r in good]
    bad = [
        '{"type": "transfer", "v": 1, "ts": 1764400000',  # truncated JSON
        b"\xff\xfe\xfa invalid utf-8".decode("latin-1"),
        json.dumps({**good[0], "rank": "zero", "ts": 1.0}),  # wrong type
        json.dumps({**good[0], "status": "maybe", "ts": 2.0}),  # unknown status
        json.dumps({"type": "transfer", "v": 1}),  # missing fields
        "x" * (1 << 20),  # a 1 MB line
    ]
    folder = tmp_path / "in"
    folder.mkdir()
    body = "\n".join(lines[:2] + bad + lines[2:]) + "\n"
    (folder / "trace.jsonl").write_bytes(body.encode("latin-1"))
    (folder / "empty.jsonl").write_bytes(b"")
    (folder / "garbage.bin").write_bytes(bytes(random.Random(1).randrange(256) for _ in range(4096)))
    (folder / "readme.md").write_text("# not telemetry\n")
    (folder / "config.json").write_text('{"architectures": ["X"], ')  # truncated config
    summary = ingest([folder], tmp_path / "store")
    c = counts(tmp_path / "store")
    assert c["transfers"] == 6 and c["requests"] == 3  # every valid record is present
    con = Store(tmp_path / "store").connect()
    reasons = dict(
        con.sql("SELECT line_number, reason FROM rejects WHERE format = 'connector_trace'").fetchall()
    )
    assert reasons[3].startswith("not valid JSON")
    assert reasons[4] == "invalid UTF-8"
    assert reasons[5].startswith("wrong type for rank")
    assert reasons[6] == "unknown status maybe"
    assert reasons[7].startswith("missing field")
    assert reasons[8].startswith("not valid JSON")
    assert max(len(r) for (r,) in con.sql("SELECT raw FROM rejects").fetchall()) <= 512
    statuses = dict(con.sql("SELECT regexp_extract(uri, '[^/]+$'), status FROM sources").fetchall())
    assert statuses == {
        "trace.jsonl": "ok",
        "empty.jsonl": "empty",
        "garbage.bin": "unrecognised",
        "readme.md": "unrecognised",
        "config.json": "error",
    }
    assert summary.rejects == 7


def test_interrupted_batch_leaves_store_readable_and_rerun_exact(tmp_path, monkeypatch):
    data = bundle(tmp_path / "in", n=15)
    store_root = tmp_path / "store"
    original = Store.write_batch

    def crash_before_commit(self, batch_id, tables, sources):
        for name, table in tables.items():
            if table.num_rows:
                self._write_table(batch_id, __import__("hybridtrace.schema").schema.table_schema(name), table)
        raise KeyboardInterrupt("killed before the manifest was written")

    monkeypatch.setattr(Store, "write_batch", crash_before_commit)
    with pytest.raises(KeyboardInterrupt):
        ingest([data], store_root)
    assert counts(store_root)["transfers"] == 0  # uncommitted data is invisible
    monkeypatch.setattr(Store, "write_batch", original)
    ingest([data], store_root)
    clean = tmp_path / "clean"
    ingest([data], clean)
    assert counts(store_root) == counts(clean)
    leftovers = [p for p in store_root.rglob("*.parquet")]
    assert len(leftovers) == len(list(clean.rglob("*.parquet")))


def _store_rows(root: Path) -> list[tuple]:
    return sorted(storeread.rows(root, "SELECT request_id, rank, ts, transported_bytes FROM transfers"))


def _all_rows(root: Path) -> dict[str, list[tuple]]:
    queries = {
        "transfers": "SELECT request_id, rank, ts, transported_bytes, line_number FROM transfers",
        "requests": "SELECT request_id, ts, missing_tokens FROM requests",
        "log_events": "SELECT engine_id, kind, ts, request_id, line_number, event_hash FROM log_events",
        "intervals": "SELECT engine_id, source_kind, end_ts, transfers, transported_bytes FROM intervals",
        # an instance is its folder's path, which differs between a bucket and a local folder
        "prom_samples": "SELECT regexp_extract(instance, '([^/]+)$', 1), metric, labels, le, ts, value "
        "FROM prom_samples",
    }
    return {name: sorted(storeread.rows(root, sql), key=repr) for name, sql in queries.items()}


@pytest.mark.slow
def test_killed_process_at_random_points_then_rerun_matches_clean(tmp_path):
    from loggen import decode_log, prefill_log
    from promgen import scrape

    data = tmp_path / "in"
    for i in range(6):
        write_jsonl(data / f"engine-{i}" / "trace.jsonl", transfer_records(60, seed=i))
        (data / f"engine-{i}" / "vllm.log").write_text(decode_log() * 20)
        (data / f"engine-{i}" / "metrics-20260421T1000{i:02d}Z.prom").write_text(
            scrape([(0.01, 0.001, 5000, 9)] * i)
        )
    (data / "prefill" / "vllm.log.1.gz").parent.mkdir()
    (data / "prefill" / "vllm.log.1.gz").write_bytes(gzip.compress(prefill_log().encode() * 50))
    store_root, clean = tmp_path / "store", tmp_path / "clean"
    # tiny batches and chunks: many commits, and large objects committed in slices
    env = {**os.environ, "HYBRIDTRACE_BATCH_OBJECTS": "1", "HYBRIDTRACE_BATCH_ROWS": "40",
           "HYBRIDTRACE_CHUNK_BYTES": "4096"}  # fmt: skip
    command = [sys.executable, "-m", "hybridtrace", "ingest", str(data), "--store", str(store_root), "-q"]
    rng = random.Random(42)
    for _ in range(4):
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.5, 2.0))
        process.send_signal(signal.SIGKILL)
        process.wait()
        Store(store_root).connect()  # readable after every kill
    subprocess.run(command, env=env, check=True, capture_output=True)
    ingest([data], clean)
    got, want = _all_rows(store_root), _all_rows(clean)
    for name in want:
        assert got[name] == want[name], name
    assert len(want["transfers"]) == 6 * 60 * 2 and want["log_events"] and want["prom_samples"]


def test_fast_and_careful_paths_give_the_same_rows():
    import duckdb

    from hybridtrace.ingest.trace import fast_parse, parse_trace

    records = [engine_record("decode-0", "decode", 2), *transfer_records(30, seed=3)]
    records[5]["groups"] = [{"group": 0, "kind": "attention", "blocks": 3, "bytes": 100, "descriptors": 6}]
    records[6]["request_id"] = 12345  # an id given as a number is read as its text
    # groups in any order, two attention-like kinds, and an empty breakdown
    records[7]["groups"] = [
        {"group": 1, "kind": "mamba", "blocks": 1, "bytes": 7000, "descriptors": 2},
        {"group": 0, "kind": "attention", "blocks": 2, "bytes": 500, "descriptors": 4},
        {"group": 2, "kind": "sliding_window", "blocks": 1, "bytes": 30, "descriptors": 1},
    ]
    records[8]["groups"] = []
    lines = [json.dumps(r).encode() for r in records]
    fast = fast_parse(b"\n".join(lines), 1, len(lines), "src")
    assert fast is not None
    careful, rejects = parse_trace(duckdb.connect(), lines, 1, "src")
    assert rejects.num_rows == 0
    for name in ("transfers", "requests", "engines"):
        assert fast[name].to_pylist() == careful[name].to_pylist(), name
    ids = fast["transfers"]["request_id"].to_pylist() + fast["requests"]["request_id"].to_pylist()
    assert "12345" in ids
    assert any(g and '"blocks":3' in g for g in fast["transfers"]["groups"].to_pylist())
    by_line = {
        row["line_number"]: (row["attention_transported_bytes"], row["state_transported_bytes"])
        for row in fast["transfers"].to_pylist()
    }
    assert by_line[6] == (100, 0) and by_line[8] == (530, 7000)
    assert by_line[9] == (None, None)  # an empty breakdown says nothing


def test_a_bad_line_sends_its_chunk_down_the_careful_path():
    from hybridtrace.ingest.trace import fast_parse

    good = [json.dumps(r).encode() for r in transfer_records(3)]
    record = transfer_records(1)[0]
    bad_lines = [
        b"not json",
        b"",
        json.dumps({**record, "rank": "x"}).encode(),
        json.dumps({**record, "request_id": {"a": 1}}).encode(),
        # no silent coercion: a fraction, a boolean or a quoted number is a wrong type
        json.dumps({**record, "rank": 1.5}).encode(),
        json.dumps({**record, "rank": True}).encode(),
        json.dumps({**record, "xfer_s": "0.1"}).encode(),
        # values of the right type that no deployment has
        json.dumps({**record, "tp_size": 0}).encode(),
        json.dumps({**record, "rank": record["tp_size"]}).encode(),
        json.dumps({**record, "remote_rank": -1}).encode(),
    ]
    for bad in bad_lines:
        block = b"\n".join([*good, bad])
        assert fast_parse(block, 1, block.count(b"\n") + 1, "src") is None, bad
    import duckdb

    from hybridtrace.ingest.trace import parse_trace

    _, rejects = parse_trace(duckdb.connect(), [*good, *bad_lines[4:]], 1, "src")
    assert [r.split(" (")[0] for r in rejects["reason"].to_pylist()] == [
        "wrong type for rank",
        "wrong type for rank",
        "wrong type for xfer_s",
        "tp_size out of range: 0",
        f"rank out of range: {record['tp_size']}",
        "remote_rank out of range: -1",
    ]


def _source_files(root: Path) -> int:
    return len(list((root / "sources").glob("part-*.parquet")))


def test_many_small_runs_are_compacted_and_nothing_changes(tmp_path, monkeypatch):
    import hybridtrace.store.commit as store_module

    data, store_root, clean = tmp_path / "in", tmp_path / "store", tmp_path / "clean"
    monkeypatch.setattr(store_module, "COMPACT_MIN_BATCHES", 1_000)  # none yet
    for i in range(12):  # a scheduled job: every run brings a little
        write_jsonl(data / f"engine-{i % 3}" / f"trace-{i}.jsonl", transfer_records(4, seed=i))
        ingest([data], store_root)
    assert _source_files(store_root) == 12
    before = _all_rows(store_root)
    reader = Store(store_root).connect()  # a query that listed the files before the merge
    merged = Store(store_root).compact(min_batches=8)
    assert merged == 12 and _all_rows(store_root) == before
    # the merged files are in use; the old ones stay for readers like that one
    assert _source_files(store_root) == 13
    assert reader.sql("SELECT count(*) FROM transfers").fetchall()[0][0] == len(before["transfers"])
    monkeypatch.setattr(store_module, "COMPACT_GRACE_S", 0.0)  # an hour later
    Store(store_root).recover()
    assert _source_files(store_root) == 1 and _all_rows(store_root) == before
    ingest([data], clean)
    assert before == _all_rows(clean)
    again = ingest([data], store_root)  # the merged manifest still says what was read
    assert again.objects_read == 0 and again.objects_skipped == 12


@pytest.mark.parametrize("crash_at", ["before the commit", "after the commit"])
def test_a_compaction_cut_short_leaves_every_row_once(tmp_path, monkeypatch, crash_at):
    import hybridtrace.store.commit as store_module

    data, store_root = tmp_path / "in", tmp_path / "store"
    monkeypatch.setattr(store_module, "COMPACT_MIN_BATCHES", 1_000)
    monkeypatch.setattr(store_module, "COMPACT_GRACE_S", 0.0)  # old files go at once
    for i in range(6):
        write_jsonl(data / f"trace-{i}.jsonl", transfer_records(3, seed=i))
        ingest([data], store_root)
    before = _all_rows(store_root)
    store = Store(store_root)
    revive = kill_writes(monkeypatch, store, crash_at)
    with pytest.raises(OSError):
        store.compact(min_batches=2)
    assert _all_rows(store_root) == before  # readable, every row once
    revive()
    ingest([data], store_root)  # recover clears what the cut compaction left
    assert _all_rows(store_root) == before
    expected_files = 1 if crash_at == "after the commit" else 6
    assert _source_files(store_root) == expected_files


def test_an_unterminated_last_line_then_growth_keeps_line_numbers(tmp_path):
    trace = tmp_path / "in" / "t.jsonl"
    records = [json.dumps(r) for r in transfer_records(3)]  # 9 lines: 6 transfers, 3 requests
    trace.parent.mkdir(parents=True)
    trace.write_text("\n".join(records[:3]))  # line 3 has no newline yet
    ingest([tmp_path / "in"], tmp_path / "s")
    with open(trace, "a") as handle:
        handle.write("\n" + "\n".join(records[3:5]) + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    con = Store(tmp_path / "s").connect()
    numbers = sorted(r[0] for r in con.sql("SELECT line_number FROM transfers UNION ALL "
                                            "SELECT line_number FROM requests").fetchall())  # fmt: skip
    assert numbers == [1, 2, 3, 4, 5]


def test_rejects_are_not_repeated_when_a_file_is_read_again(tmp_path):
    trace = tmp_path / "in" / "t.jsonl"
    trace.parent.mkdir(parents=True)
    trace.write_text(json.dumps(transfer_records(1)[0]) + "\nnot json\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    os.utime(trace, (time.time() + 5, time.time() + 5))  # touched: read again whole
    ingest([tmp_path / "in"], tmp_path / "s")
    assert storeread.rows(tmp_path / "s", "SELECT count(*) FROM rejects") == [(1,)]


def test_one_writer_at_a_time(tmp_path):
    from hybridtrace.errors import UsageError

    store = Store(tmp_path / "s")
    store.init()
    with store.writer_lock(), pytest.raises(UsageError, match="another ingest"):
        ingest([tmp_path], tmp_path / "s")


def test_a_store_that_cannot_take_a_slice_stops_the_run(tmp_path, monkeypatch):
    import errno

    import hybridtrace.ingest.run as run
    from hybridtrace.errors import StoreWriteError
    from hybridtrace.storage import LocalRoot

    write_jsonl(tmp_path / "in" / "trace.jsonl", transfer_records(200))  # 600 lines
    stamp = time.time() - 3600  # quiet: its last line is complete even without a newline
    os.utime(tmp_path / "in" / "trace.jsonl", (stamp, stamp))
    monkeypatch.setattr(run, "BATCH_ROWS", 100)  # committed in slices
    monkeypatch.setattr(run, "CHUNK_BYTES", 4096)
    real, failures = LocalRoot.write_parquet, []

    def full_once(self, table, rel):
        if not failures and "/transfers/" in f"/{rel}":
            failures.append(rel)
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, table, rel)

    monkeypatch.setattr(LocalRoot, "write_parquet", full_once)
    with pytest.raises(StoreWriteError, match="No space left"):
        ingest([tmp_path / "in"], tmp_path / "s")
    ingest([tmp_path / "in"], tmp_path / "s")  # the disk has room again
    rows = storeread.rows(tmp_path / "s", "SELECT count(*) FROM transfers")[0][0]
    assert rows == 400  # nothing lost
