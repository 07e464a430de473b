"""Inputs that used to hang or abort a whole ingest run.

Each is now read, rejected or recorded in `sources` with the reason, and everything beside
it is ingested: JSON nested deeper than Python's parser goes, links that loop or lead out
of the input folder, bucket keys pyarrow cannot open, FIFOs and sockets, a last record cut
short for good, a config.json read again or unreadable, credentials in a URI's query.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import servers
import storeread
from loggen import decode_log
from promgen import scrape
from tracegen import transfer_records, write_jsonl

from hybridtrace.ingest.run import ingest
from hybridtrace.job import JobConfig, run_job
from hybridtrace.store import CUT_RECORD, Store

REQUIRE = os.environ.get("HYBRIDTRACE_REQUIRE_SERVERS") == "1"
SCRIPT = Path(sys.executable).with_name("hybridtrace")
COMMAND = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "hybridtrace"]
CONFIGS = Path(__file__).resolve().parent.parent / "analyzer" / "model" / "configs"
CONFIG = CONFIGS / "llama-3-8b-instruct.json"
# Python's JSON parser recurses once per level: these are far past its limit.
DEEP = "[" * 10_000 + "]" * 10_000


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # a timeout, so that an ingest that hangs fails the test instead of stalling the suite
    environ = {k: v for k, v in os.environ.items() if k != "HYBRIDTRACE_DEBUG"} | (env or {})
    return subprocess.run([*COMMAND, *args], cwd=cwd, capture_output=True, text=True, env=environ,
                          timeout=120)  # fmt: skip


def query(store: Path, sql: str) -> list[tuple]:
    return storeread.rows(store, sql)


def count(store: Path, table: str) -> int:
    return query(store, f"SELECT count(*) FROM {table}")[0][0]


def manifest(store: Path) -> dict[str, tuple[str, str | None]]:
    """Each object's latest (status, message), by the last part of its name."""
    found = query(store, "SELECT uri, status, message FROM sources ORDER BY ingested_at")
    return {uri.rsplit("/", 1)[-1]: (status, message) for uri, status, message in found}


def trace(path: Path, requests: int = 3, seed: int = 0) -> None:
    """A decode engine's trace at TP 2: two transfers and one request record per request."""
    write_jsonl(path, transfer_records(requests, seed=seed))


def quiet(*paths: Path) -> None:
    """Make files look untouched for an hour: they can no longer grow."""
    stamp = time.time() - 3600
    for path in paths:
        os.utime(path, (stamp, stamp))


def trace_lines(requests: int = 3, seed: int = 0) -> list[str]:
    return [json.dumps(r) for r in transfer_records(requests, seed=seed)]


# --- 1. JSON nested deeper than the parser goes -------------------------------------------


def test_a_file_of_100000_nested_brackets_is_unrecognised_and_the_rest_is_read(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "nest.json").write_text("[" * 100_000 + "]" * 100_000)
    trace(tmp_path / "in" / "decode-0" / "trace.jsonl")
    done = cli("ingest", "in", "--store", "st", cwd=tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert manifest(tmp_path / "st")["nest.json"] == ("unrecognised", None)
    assert count(tmp_path / "st", "transfers") == 6


def test_a_trace_whose_first_record_nests_10000_deep_is_read_as_a_trace(tmp_path):
    lines = trace_lines()
    first = json.loads(lines[0])
    deep = json.dumps(first)[:-1] + f', "extra": {DEEP}}}'  # an unknown extra field: ignored
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "trace.jsonl").write_text("\n".join([deep, *lines[1:]]) + "\n")
    (tmp_path / "clean").mkdir()
    (tmp_path / "clean" / "trace.jsonl").write_text("\n".join(lines) + "\n")
    summary = ingest([tmp_path / "in"], tmp_path / "st")
    ingest([tmp_path / "clean"], tmp_path / "clean-st")
    assert summary.by_format == {"connector_trace": 1} and summary.rejects == 0
    transfers = "SELECT request_id, rank, transported_bytes, line_number FROM transfers ORDER BY ALL"
    assert query(tmp_path / "st", transfers) == query(tmp_path / "clean-st", transfers)
    assert count(tmp_path / "st", "transfers") == 6


def test_a_config_json_nested_10000_deep_is_an_error_row_and_the_run_exits_2(tmp_path):
    config = json.loads(CONFIG.read_text())
    (tmp_path / "in" / "model").mkdir(parents=True)
    (tmp_path / "in" / "model" / "config.json").write_text(json.dumps(config)[:-1] + f', "x": {DEEP}}}')
    trace(tmp_path / "in" / "decode-0" / "trace.jsonl")
    done = cli("ingest", "in", "--store", "st", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "config.json: nested too deeply to parse" in done.stderr
    assert manifest(tmp_path / "st")["config.json"] == ("error", "nested too deeply to parse")
    assert count(tmp_path / "st", "transfers") == 6 and count(tmp_path / "st", "models") == 0


def test_a_model_option_naming_a_config_nested_10000_deep_is_refused_in_one_line(tmp_path):
    (tmp_path / "deep.json").write_text(f'{{"architectures": ["LlamaForCausalLM"], "x": {DEEP}}}')
    trace(tmp_path / "in" / "trace.jsonl")
    for args in (("ingest", "in", "--store", "st", "--model", "deep.json"), ("model", "deep.json")):
        done = cli(*args, cwd=tmp_path)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert "not a readable config.json (nested too deeply)" in done.stderr


# --- 2. links ----------------------------------------------------------------------------


def test_two_links_to_their_own_folder_do_not_make_ingest_hang(tmp_path):
    trace(tmp_path / "in" / "decode-0" / "trace.jsonl")
    (tmp_path / "in" / "l1").symlink_to(".")
    (tmp_path / "in" / "l2").symlink_to(".")
    done = cli("ingest", "in", "--store", "st", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = manifest(tmp_path / "st")
    assert found["trace.jsonl"] == ("ok", None) and count(tmp_path / "st", "transfers") == 6
    for link in ("l1", "l2"):
        status, message = found[link]
        assert status == "skipped" and "a folder walked already: not followed" in message
    again = cli("ingest", "in", "--store", "st", cwd=tmp_path)
    assert again.returncode == 0 and count(tmp_path / "st", "sources") == 3  # said once


def test_a_link_out_of_the_input_folder_is_not_followed(tmp_path):
    trace(tmp_path / "in" / "sub" / "trace.jsonl")
    trace(tmp_path / "elsewhere" / "trace.jsonl", seed=7)  # reached only through the link
    (tmp_path / "in" / "sub" / "up").symlink_to(Path("..") / "..")
    summary = ingest([tmp_path / "in"], tmp_path / "st")
    assert query(tmp_path / "st", "SELECT DISTINCT uri FROM sources WHERE status = 'ok'") == [
        (str((tmp_path / "in" / "sub" / "trace.jsonl").resolve()),)
    ]
    status, message = manifest(tmp_path / "st")["up"]
    assert status == "skipped" and f"outside {(tmp_path / 'in').resolve()}: not followed" in message
    assert summary.objects_left_out == 1 and summary.objects_read == 1


def test_a_link_named_on_the_command_line_is_followed(tmp_path):
    trace(tmp_path / "data" / "decode-0" / "trace.jsonl")
    (tmp_path / "current").symlink_to(tmp_path / "data")
    summary = ingest([tmp_path / "current"], tmp_path / "st")
    assert summary.objects_read == 1 and summary.errors == 0
    assert count(tmp_path / "st", "transfers") == 6
    assert query(tmp_path / "st", "SELECT status FROM sources") == [("ok",)]


# --- 3. objects that cannot be opened ------------------------------------------------------


@pytest.fixture
def s3(monkeypatch) -> Iterator[servers.Server]:
    if not REQUIRE:
        pytest.importorskip("moto.server")
    with servers.moto_s3() as server:
        for name, value in server.env.items():
            monkeypatch.setenv(name, value)
        server.make_bucket("telemetry")
        yield server


def _put_key(server: servers.Server, key: str, data: bytes) -> None:
    """Put an object under any key: pyarrow itself refuses to write the odd ones."""
    import boto3

    client = boto3.client("s3", endpoint_url=server.env["AWS_ENDPOINT_URL"], region_name="us-east-1")
    client.put_object(Bucket="telemetry", Key=key, Body=data)


@pytest.mark.servers
def test_a_bucket_key_with_an_empty_path_segment_is_a_row_and_the_rest_is_read(tmp_path, s3):
    s3.put("telemetry/prod/decode-0/trace.jsonl", "".join(f"{line}\n" for line in trace_lines()).encode())
    _put_key(s3, "prod//z.log", decode_log().encode())
    summary = ingest(["s3://telemetry/prod/"], tmp_path / "st")
    assert summary.objects_read == 1 and summary.objects_left_out == 1 and summary.errors == 0
    status, message = manifest(tmp_path / "st")["z.log"]
    assert status == "skipped" and "empty path segment" in message
    assert count(tmp_path / "st", "transfers") == 6
    again = ingest(["s3://telemetry/prod/"], tmp_path / "st")  # the next scheduled run
    assert again.objects_left_out == 0 and count(tmp_path / "st", "sources") == 2


@pytest.mark.servers
def test_bucket_keys_with_dot_segments_get_a_row(tmp_path, s3):
    s3.put("telemetry/prod/decode-0/trace.jsonl", "".join(f"{line}\n" for line in trace_lines()).encode())
    _put_key(s3, "prod/./d.log", decode_log().encode())
    _put_key(s3, "prod/x/../e.log", decode_log().encode())
    _put_key(s3, "prod/.hidden/f.log", decode_log().encode())  # hidden, as on a disk: no row
    summary = ingest(["s3://telemetry/prod/"], tmp_path / "st")
    found = manifest(tmp_path / "st")
    for name in ("d.log", "e.log"):
        status, message = found[name]
        assert status == "skipped" and "a . or .. path segment" in message
    assert "f.log" not in found
    assert summary.objects_left_out == 2 and count(tmp_path / "st", "transfers") == 6


def test_a_fifo_is_never_opened_and_gets_a_row(tmp_path):
    trace(tmp_path / "in" / "trace.jsonl")
    os.mkfifo(tmp_path / "in" / "pipe.log")  # opened, it would block until someone writes
    (tmp_path / "in" / "pipe-link.log").symlink_to("pipe.log")
    done = cli("ingest", "in", "--store", "st", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = manifest(tmp_path / "st")
    assert found["pipe.log"] == ("skipped", "a FIFO, not a regular file: never opened")
    assert found["pipe-link.log"][0] == "skipped" and "a link to a FIFO" in found["pipe-link.log"][1]
    assert count(tmp_path / "st", "transfers") == 6


def test_a_socket_gets_a_row(tmp_path):
    trace(tmp_path / "in" / "trace.jsonl")
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(tmp_path / "in" / "agent.sock"))
        summary = ingest([tmp_path / "in"], tmp_path / "st")
    found = manifest(tmp_path / "st")
    assert found["agent.sock"] == ("skipped", "a socket, not a regular file: never opened")
    assert summary.objects_left_out == 1 and summary.errors == 0


# --- 5. a last record cut short for good ---------------------------------------------------


def _cut_bundle(root: Path) -> None:
    """Objects whose last line has no newline, all untouched for an hour."""
    lines = trace_lines()
    cut = "\n".join(lines)[:-10]  # the last record lost its end
    (root / "a").mkdir(parents=True)
    (root / "a" / "trace.jsonl").write_text(cut)
    (root / "a" / "trace.jsonl.1.gz").write_bytes(gzip.compress(cut.encode()))
    (root / "a" / "whole.jsonl").write_text("\n".join(trace_lines(seed=4)))  # whole, just no newline
    (root / "a" / "vllm.log").write_text(decode_log().rstrip("\n"))
    (root / "b").mkdir()
    (root / "b" / "metrics-1764400000.prom").write_text(scrape([(0.01, 0.001, 5000, 9)]).rstrip("\n"))
    (root / "c").mkdir()
    (root / "c" / "config.json").write_text(CONFIG.read_text().rstrip("\n"))
    quiet(*(p for p in root.rglob("*") if p.is_file()))


def test_a_cut_last_record_is_one_reject_and_five_runs_add_no_sources_rows(tmp_path):
    _cut_bundle(tmp_path / "in")
    sizes = []
    for _ in range(5):
        ingest([tmp_path / "in"], tmp_path / "st")
        sizes.append(count(tmp_path / "st", "sources"))
    assert sizes == [6] * 5
    rejects = query(tmp_path / "st", "SELECT regexp_extract(uri, '[^/]+$'), line_number, reason FROM rejects")
    assert sorted(rejects) == [("trace.jsonl", 9, CUT_RECORD), ("trace.jsonl.1.gz", 9, CUT_RECORD)]
    assert {status for status, _ in manifest(tmp_path / "st").values()} == {"ok"}


def test_a_cut_last_record_that_grows_after_all_is_read_whole_once(tmp_path):
    lines = trace_lines()
    text = "\n".join(lines)
    log = tmp_path / "in" / "trace.jsonl"
    log.parent.mkdir()
    log.write_text(text[:-10])
    quiet(log)
    ingest([tmp_path / "in"], tmp_path / "st")
    assert count(tmp_path / "st", "rejects") == 1
    with open(log, "a") as handle:  # the writer was only slow
        handle.write(text[-10:] + "\n")
    grown = ingest([tmp_path / "in"], tmp_path / "st")
    assert grown.rows["requests"] == 1 and count(tmp_path / "st", "rejects") == 0
    assert count(tmp_path / "st", "transfers") + count(tmp_path / "st", "requests") == len(lines)
    both = "SELECT line_number FROM transfers UNION ALL SELECT line_number FROM requests"
    numbers = query(tmp_path / "st", both)
    assert sorted(n for (n,) in numbers) == list(range(1, len(lines) + 1))


def test_a_cut_last_record_of_a_file_still_written_is_held_back(tmp_path):
    # the clean twin: a file modified just now may still be written, so it waits
    lines = trace_lines()
    log = tmp_path / "in" / "trace.jsonl"
    log.parent.mkdir()
    log.write_text("\n".join(lines)[:-10])
    ingest([tmp_path / "in"], tmp_path / "st")
    assert count(tmp_path / "st", "rejects") == 0
    assert query(tmp_path / "st", "SELECT status FROM sources") == [("partial",)]


@pytest.mark.servers
def test_a_cut_last_record_in_a_bucket_is_one_reject_until_the_object_grows(tmp_path, s3):
    text = "\n".join(trace_lines())
    s3.put("telemetry/prod/trace.jsonl", text[:-10].encode())
    for _ in range(3):
        ingest(["s3://telemetry/prod/"], tmp_path / "st")
    assert count(tmp_path / "st", "sources") == 1 and count(tmp_path / "st", "rejects") == 1
    s3.put("telemetry/prod/trace.jsonl", (text + "\n").encode())  # uploaded again, whole
    ingest(["s3://telemetry/prod/"], tmp_path / "st")
    assert count(tmp_path / "st", "rejects") == 0 and count(tmp_path / "st", "requests") == 3


# --- 6. a config.json read again -----------------------------------------------------------


def test_a_touched_config_json_adds_no_second_models_row(tmp_path):
    config = tmp_path / "in" / "llama" / "config.json"
    config.parent.mkdir(parents=True)
    config.write_text(CONFIG.read_text())
    ingest([tmp_path / "in"], tmp_path / "st")
    for step in (1, 2):
        os.utime(config, (time.time() + step, time.time() + step))  # touched: read again
        ingest([tmp_path / "in"], tmp_path / "st")
    assert count(tmp_path / "st", "models") == 1
    reads = query(tmp_path / "st", "SELECT rows, duplicates FROM sources ORDER BY ingested_at")
    assert reads == [('{"models": 1}', 0), ('{"models": 0}', 1), ('{"models": 0}', 1)]


def test_a_changed_config_json_adds_its_new_content(tmp_path):
    # the twin: new content at the same place is a new row, and the newest is the one used
    config = tmp_path / "in" / "llama" / "config.json"
    config.parent.mkdir(parents=True)
    config.write_text(CONFIG.read_text())
    ingest([tmp_path / "in"], tmp_path / "st")
    changed = {**json.loads(CONFIG.read_text()), "num_hidden_layers": 16}
    config.write_text(json.dumps(changed))
    os.utime(config, (time.time() + 5, time.time() + 5))
    ingest([tmp_path / "in"], tmp_path / "st")
    assert count(tmp_path / "st", "models") == 2


def test_a_copy_of_a_config_json_in_a_second_folder_keeps_its_own_row(tmp_path):
    # as documented: one row per config.json found in the input
    for folder in ("a", "b"):
        (tmp_path / "in" / folder).mkdir(parents=True)
        (tmp_path / "in" / folder / "config.json").write_text(CONFIG.read_text())
    ingest([tmp_path / "in"], tmp_path / "st")
    assert count(tmp_path / "st", "models") == 2


# --- 10. the exit code for a config.json that cannot be read ----------------------------------


def test_a_broken_config_json_makes_ingest_exit_2(tmp_path):
    (tmp_path / "in" / "model").mkdir(parents=True)
    (tmp_path / "in" / "model" / "config.json").write_text('{"architectures": ["X"], ')
    trace(tmp_path / "in" / "decode-0" / "trace.jsonl")
    done = cli("ingest", "in", "--store", "st", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "hybridtrace: error:" in done.stderr and "config.json" in done.stderr
    assert manifest(tmp_path / "st")["config.json"][0] == "error"
    assert count(tmp_path / "st", "transfers") == 6


def test_the_job_reports_a_broken_config_json_as_unreadable_input(tmp_path):
    (tmp_path / "in" / "model").mkdir(parents=True)
    (tmp_path / "in" / "model" / "config.json").write_text('{"architectures": ["X"], ')
    trace(tmp_path / "in" / "decode-0" / "trace.jsonl")
    code, summary = run_job(JobConfig(paths=[str(tmp_path / "in")], store=str(tmp_path / "st")))
    assert code == 2 and summary["status"] == "unreadable input" and summary["unreadable"] == 1
    assert "config.json" in summary["message"] and summary["findings"] is not None


# --- 10. credentials in a URI's query ------------------------------------------------------


# Nothing is ever asked of a server: the refusal comes first (these addresses refuse anyway).
NO_SERVER = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9",
             "AWS_EC2_METADATA_DISABLED": "true", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
             "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip


@pytest.mark.parametrize(
    "uri",
    ["s3://telemetry/prod?access_key=AKIAHYBRID0TEST",
     "s3://telemetry/prod/?secret_key=hybridSecret0Test",
     "gs://telemetry/prod?session_token=hybridToken0Test",
     "s3://telemetry/prod?region=us-east-1&Secret_Key=hybridSecret0Test",
     "s3://telemetry/prod?SESSION-TOKEN=hybridToken0Test"],
)  # fmt: skip
def test_credentials_in_a_uri_query_are_refused(tmp_path, uri):
    secret = uri.rsplit("=", 1)[1]
    (tmp_path / "in").mkdir()
    trace(tmp_path / "in" / "trace.jsonl")
    for args in (("ingest", uri, "--store", "st"), ("ingest", "in", uri, "--store", "st"),
                 ("ingest", "in", "--store", uri)):  # fmt: skip
        done = cli(*args, cwd=tmp_path, env=NO_SERVER)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert "credentials in their query are refused" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
        assert secret not in done.stdout + done.stderr
    assert not (tmp_path / "st").exists()  # nothing was listed, read or written


@pytest.mark.parametrize("key", ["paths", "html"])
def test_a_job_file_with_credentials_in_a_uri_query_is_refused_before_anything_runs(tmp_path, key):
    trace(tmp_path / "in" / "trace.jsonl")
    uris = {"paths": f"['{tmp_path / 'in'}']", "html": f"'{tmp_path / 'report.html'}'"}
    uris[key] = "'s3://telemetry/prod?Secret_Key=hybridSecret0Test'"
    if key == "paths":
        uris[key] = f"[{uris[key]}]"
    job = tmp_path / "job.toml"
    job.write_text(f"[inputs]\npaths = {uris['paths']}\n[store]\npath = '{tmp_path / 'st'}'\n"
                   f"[report]\nhtml = {uris['html']}\n")  # fmt: skip
    done = cli("run", "--config", str(job), cwd=tmp_path, env=NO_SERVER)
    assert done.returncode == 2 and json.loads(done.stdout)["status"] == "error", done.stdout
    assert "credentials in their query are refused" in done.stderr
    assert "hybridSecret0Test" not in done.stdout + done.stderr
    assert not (tmp_path / "st").exists()  # nothing was ingested


def test_a_corrupt_gzip_is_marked_and_the_run_goes_on(tmp_path):
    from loggen import vllm_line

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


def test_a_cut_gzip_keeps_the_lines_before_the_cut(tmp_path):
    records = transfer_records(300)
    text = "".join(json.dumps(r) + "\n" for r in records).encode()
    whole = gzip.compress(text, compresslevel=1)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "trace.jsonl.gz").write_bytes(whole[: int(len(whole) * 0.8)])
    summary = ingest([tmp_path / "in"], tmp_path / "s")
    assert 0 < summary.rows.get("transfers", 0) < 600
    status = storeread.rows(tmp_path / "s", "SELECT status FROM sources")
    assert status == [("error",)]


def test_a_half_written_line_in_a_quiet_file_is_never_two_lines(tmp_path, monkeypatch):
    # A writer stopped mid-line long enough for the file to look finished, then went on.
    # Log: the part read counts as the line, the rest is passed over, and the lines after
    # keep their numbers. Trace: a cut record is not taken at all; it is read once whole.
    from loggen import vllm_line

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
