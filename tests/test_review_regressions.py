"""Regressions for defects found in review: each test failed before its fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from loggen import vllm_line
from tracegen import engine_record, transfer_records, write_jsonl

from hybridtrace.analyze import analyze
from hybridtrace.errors import HybridtraceError, UsageError
from hybridtrace.ingest.run import ingest
from hybridtrace.simulate import SimOptions, simulate
from hybridtrace.store import Store


def old(path: Path) -> None:
    stamp = time.time() - 3600  # quiet: its last line is complete even without a newline
    os.utime(path, (stamp, stamp))


def test_pure_mamba_models_are_accounted(tmp_path):
    simulate(
        SimOptions(model="mamba-codestral-7b", requests=60, inject={"unsharded_state": 0.5}), tmp_path / "b"
    )
    ingest([tmp_path / "b"], tmp_path / "s")
    con = Store(tmp_path / "s").connect()
    assert con.sql("SELECT count(*) FROM transfer_bytes WHERE expected_bytes IS NULL").fetchall()[0][0] == 0
    truth = json.loads((tmp_path / "b" / "truth.json").read_text())
    found = analyze(con).summary
    assert found["findings_by_kind"]["unsharded_state"] == truth["summary"]["injected"]["unsharded_state"]
    assert found["transported_over_expected"] is not None


def test_a_banner_before_the_first_vllm_line_is_looked_at_again(tmp_path):
    log = tmp_path / "in" / "a" / "vllm.log"
    log.parent.mkdir(parents=True)
    log.write_text("starting the server\nloading...\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    with open(log, "a") as handle:
        handle.write(vllm_line("after the banner", level="WARNING") + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    rows = Store(tmp_path / "s").connect().sql("SELECT line_number, message FROM log_events").fetchall()
    assert rows == [(3, "after the banner")]


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


def test_a_chunk_starting_with_a_blank_line_counts_it(tmp_path):
    log = tmp_path / "in" / "a" / "vllm.log"
    log.parent.mkdir(parents=True)
    log.write_text("\n" + vllm_line("second line", level="WARNING") + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    assert Store(tmp_path / "s").connect().sql("SELECT line_number FROM log_events").fetchall() == [(2,)]


def test_choosing_a_model_again_makes_it_current(tmp_path):
    write_jsonl(
        tmp_path / "in" / "trace.jsonl", [engine_record("decode-0", "decode", 2), *transfer_records(1)]
    )
    for model in ("nemotron-nano-12b-v2", "zamba2-7b", "nemotron-nano-12b-v2"):
        ingest([tmp_path / "in"], tmp_path / "s", model=model)
    con = Store(tmp_path / "s").connect()
    latest = "SELECT model FROM models WHERE applies_to = '*' ORDER BY ingested_at DESC LIMIT 1"
    assert con.sql(latest).fetchall() == [("nvidia/NVIDIA-Nemotron-Nano-12B-v2",)]
    assert con.sql("SELECT model FROM engine_models").fetchall() == [("nvidia/NVIDIA-Nemotron-Nano-12B-v2",)]


def test_rejects_are_not_repeated_when_a_file_is_read_again(tmp_path):
    trace = tmp_path / "in" / "t.jsonl"
    trace.parent.mkdir(parents=True)
    trace.write_text(json.dumps(transfer_records(1)[0]) + "\nnot json\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    os.utime(trace, (time.time() + 5, time.time() + 5))  # touched: read again whole
    ingest([tmp_path / "in"], tmp_path / "s")
    assert Store(tmp_path / "s").connect().sql("SELECT count(*) FROM rejects").fetchall() == [(1,)]


def test_one_writer_at_a_time(tmp_path):
    store = Store(tmp_path / "s")
    store.init()
    with store.writer_lock(), pytest.raises(UsageError, match="another ingest"):
        ingest([tmp_path], tmp_path / "s")


def test_bad_model_leaves_no_store_behind(tmp_path):
    (tmp_path / "in").mkdir()
    with pytest.raises(HybridtraceError, match="not a built-in model"):
        ingest([tmp_path / "in"], tmp_path / "s", model="no-such-model")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    "args",
    [("simulate", "--out", "OUT", "--requests", "0"), ("simulate", "--out", "OUT", "--rate", "0"),
     ("query", "select error('boom')", "--store", "STORE")],
)  # fmt: skip
def test_clear_errors_not_tracebacks(tmp_path, args):
    store = Store(tmp_path / "st")
    store.init()
    args = [a.replace("OUT", str(tmp_path / "o")).replace("STORE", str(tmp_path / "st")) for a in args]
    result = subprocess.run(
        [sys.executable, "-m", "hybridtrace", *args], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr and "error" in result.stderr


# --- second review: buckets, the job, the report ---------------------------------------


def test_a_corrupt_gzip_is_marked_and_the_run_goes_on(tmp_path):
    import gzip

    data = tmp_path / "in"
    (data / "a").mkdir(parents=True)
    whole = gzip.compress(("\n".join(vllm_line(f"Engine 000: line {i}") for i in range(50)) + "\n").encode())
    (data / "a" / "vllm.log.1.gz").write_bytes(whole[: len(whole) // 2])  # cut mid-stream
    (data / "a" / "bad.log.gz").write_bytes(b"\x1f\x8b" + b"not gzip at all")
    write_jsonl(data / "b" / "trace.jsonl", transfer_records(5))
    summary = ingest([data], tmp_path / "s")
    assert summary.rows["transfers"] == 10
    con = Store(tmp_path / "s").connect()
    errors = con.sql("SELECT uri, message FROM sources WHERE status = 'error'").fetchall()
    assert sorted(Path(u).name for u, _ in errors) == ["bad.log.gz", "vllm.log.1.gz"]
    assert all(m.startswith("cannot read") for _, m in errors)
    ingest([data], tmp_path / "s")  # and again: marked, not fatal


def test_a_held_back_last_line_is_read_once_the_file_is_quiet(tmp_path, monkeypatch):
    import hybridtrace.ingest.run as run

    log = tmp_path / "in" / "vllm.log"
    log.parent.mkdir()
    stats = "Engine 000: Avg prompt throughput: {}.0 tokens/s, Avg generation throughput: 1.0 tokens/s"
    lines = [vllm_line(stats.format(i)) for i in range(3)]
    log.write_text("\n".join(lines))  # no newline after the last line: it may still be written
    monkeypatch.setattr(run, "QUIET_SECONDS", 3600.0)
    first = ingest([log], tmp_path / "s")
    events = "SELECT count(*) FROM log_events WHERE kind = 'engine_stats'"
    assert Store(tmp_path / "s").connect().sql(events).fetchall()[0][0] == 2 and first.objects_read == 1
    monkeypatch.setattr(run, "QUIET_SECONDS", 0.0)  # time passed; the file did not change
    ingest([log], tmp_path / "s")
    assert Store(tmp_path / "s").connect().sql(events).fetchall()[0][0] == 3


def test_report_with_no_logical_bytes(tmp_path):
    from hybridtrace.report import collect, render_html, render_markdown

    records = [engine_record("decode-0", "decode", 2), *transfer_records(3)]
    for record in records:
        if record["type"] == "request":
            record.pop("transferred_tokens", None)
    write_jsonl(tmp_path / "in" / "trace.jsonl", records)
    ingest([tmp_path / "in"], tmp_path / "s", model="nemotron-nano-12b-v2")
    data = collect(Store(tmp_path / "s").connect(), store="s")
    assert "hybridtrace report" in render_html(data) and render_markdown(data).startswith("### hybridtrace")


def test_run_errors_are_one_json_line_and_exit_2(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "out.html").mkdir()  # the report path is a folder
    job = tmp_path / "job.toml"
    job.write_text(f"[inputs]\npaths = ['{tmp_path / 'in'}']\n[store]\npath = '{tmp_path / 's'}'\n"
                   f"[report]\nhtml = '{tmp_path / 'out.html'}'\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "hybridtrace", "run", "--config", str(job)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert json.loads(done.stdout)["status"] == "error"
    assert not list(tmp_path.glob("*.tmp"))
    job.write_text(f"[inputs]\npaths = ['{tmp_path / 'in'}']\n[store]\npath = 's'\n"
                   "[alert]\nstrict = 'false'\n")  # fmt: skip
    from hybridtrace.job import load_job

    with pytest.raises(UsageError, match="strict must be true or false"):
        load_job(job)


def test_a_store_that_cannot_take_a_slice_stops_the_run(tmp_path, monkeypatch):
    import errno

    import hybridtrace.ingest.run as run
    from hybridtrace.errors import StoreWriteError
    from hybridtrace.storage import LocalRoot

    write_jsonl(tmp_path / "in" / "trace.jsonl", transfer_records(200))  # 600 lines
    old(tmp_path / "in" / "trace.jsonl")
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
    rows = Store(tmp_path / "s").connect().sql("SELECT count(*) FROM transfers").fetchall()[0][0]
    assert rows == 400  # nothing lost


def test_a_cut_gzip_keeps_the_lines_before_the_cut(tmp_path):
    import gzip

    records = transfer_records(300)
    text = "".join(json.dumps(r) + "\n" for r in records).encode()
    whole = gzip.compress(text, compresslevel=1)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "trace.jsonl.gz").write_bytes(whole[: int(len(whole) * 0.8)])
    summary = ingest([tmp_path / "in"], tmp_path / "s")
    assert 0 < summary.rows.get("transfers", 0) < 600
    status = Store(tmp_path / "s").connect().sql("SELECT status FROM sources").fetchall()
    assert status == [("error",)]


def test_a_half_written_line_in_a_quiet_file_is_never_two_lines(tmp_path, monkeypatch):
    # A writer stopped mid-line long enough for the file to look finished, then went on.
    # Log: the part read counts as the line, the rest is passed over, and the lines after
    # keep their numbers. Trace: a cut record is not taken at all; it is read once whole.
    import hybridtrace.ingest.run as run

    monkeypatch.setattr(run, "QUIET_SECONDS", 0.0)
    log = tmp_path / "in" / "a" / "vllm.log"
    log.parent.mkdir(parents=True)
    warn = [vllm_line(f"warning {i}", level="WARNING") for i in range(4)]
    cut = len(warn[1]) - 3  # mid-message: the line is a warning already
    log.write_text(warn[0] + "\n" + warn[1][:cut])
    trace = tmp_path / "in" / "b" / "trace.jsonl"
    trace.parent.mkdir(parents=True)
    records = [json.dumps(r) for r in transfer_records(2)]  # 6 lines: 4 transfers, 2 requests
    trace.write_text("\n".join(records[:2]) + "\n" + records[2][:25])
    ingest([tmp_path / "in"], tmp_path / "s")
    with open(log, "a") as handle:
        handle.write(warn[1][cut:] + "\n" + warn[2] + "\n" + warn[3] + "\n")
    with open(trace, "a") as handle:
        handle.write(records[2][25:] + "\n" + "\n".join(records[3:]) + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    con = Store(tmp_path / "s").connect()
    lines = con.sql("SELECT line_number, message FROM log_events ORDER BY line_number").fetchall()
    assert [n for n, _ in lines] == [1, 2, 3, 4]
    assert [m for _, m in lines][2:] == ["warning 2", "warning 3"]
    assert con.sql("SELECT count(*) FROM rejects").fetchall()[0][0] == 0
    numbers = sorted(r[0] for r in con.sql("SELECT line_number FROM transfers UNION ALL "
                                            "SELECT line_number FROM requests").fetchall())  # fmt: skip
    assert numbers == [1, 2, 3, 4, 5, 6]


def test_a_tty_log_read_on_where_it_stopped_keeps_its_shape(tmp_path):
    # Every line of a log written through a TTY ends with a carriage return, and a line
    # that continues into the next ends with two. A later read of one appended line decides
    # the shape from the file's head, as the first read did: its message has no stray CR.
    def tty(text: str) -> str:
        return text.replace("\n", "\r\n") + "\r\n"

    log = tmp_path / "in" / "a" / "vllm.log"
    log.parent.mkdir(parents=True)
    log.write_text(tty("\n".join(vllm_line(f"line {i}") for i in range(3))), newline="")
    ingest([tmp_path / "in"], tmp_path / "s")
    with open(log, "a", newline="") as handle:
        handle.write(vllm_line("part one", level="WARNING") + "\r\r\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    rows = Store(tmp_path / "s").connect().sql("SELECT line_number, message FROM log_events").fetchall()
    assert rows == [(4, "part one")]


def test_a_log_read_on_after_new_year_counts_the_year_on(tmp_path):
    # --year names the year of the log's first lines. A later read of the lines appended
    # since goes on from the year the earlier read had reached, so 01-01 after 12-31 is the
    # next year whether it is read in one go or in two.
    log = tmp_path / "in" / "a" / "vllm.log"
    log.parent.mkdir(parents=True)
    log.write_text(vllm_line("old year", level="WARNING", stamp="12-31 23:59:00") + "\n")
    ingest([tmp_path / "in"], tmp_path / "s", year=2025)
    with open(log, "a") as handle:
        handle.write(vllm_line("new year", level="WARNING", stamp="01-01 00:01:00") + "\n")
    ingest([tmp_path / "in"], tmp_path / "s", year=2025)
    rows = Store(tmp_path / "s").connect().sql(
        "SELECT message, strftime(to_timestamp(ts) AT TIME ZONE 'UTC', '%Y-%m-%d') AS day "
        "FROM log_events ORDER BY ts"
    ).fetchall()
    assert rows == [("old year", "2025-12-31"), ("new year", "2026-01-01")]


def test_a_log_read_before_its_engine_id_is_that_engines_once_known(tmp_path):
    # The first read of a fresh server's log sees its allocator lines and a warning, but not
    # yet `Initializing NIXL worker`: it files them under the folder's name. A later read
    # learns the id. Every row is then decode-0's, as one read of the whole log gives.
    log = tmp_path / "in" / "host-a" / "vllm.log"
    log.parent.mkdir(parents=True)
    log.write_text(
        vllm_line("Setting attention block size to 1312 tokens to ensure that attention page size is "
                  ">= mamba page size.", process="APIServer pid=1") + "\n"
        + vllm_line("early warning", level="WARNING") + "\n"
    )  # fmt: skip
    ingest([tmp_path / "in"], tmp_path / "s")
    with open(log, "a") as handle:
        handle.write(vllm_line("Initializing NIXL worker decode-0") + "\n")
        handle.write(vllm_line("later warning", level="WARNING") + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    ingest([tmp_path / "in"], tmp_path / "fresh")
    query = "SELECT DISTINCT engine_id FROM (SELECT engine_id FROM engines UNION ALL " \
        "SELECT engine_id FROM log_events)"
    assert Store(tmp_path / "s").connect().sql(query).fetchall() == [("decode-0",)]
    assert Store(tmp_path / "fresh").connect().sql(query).fetchall() == [("decode-0",)]
