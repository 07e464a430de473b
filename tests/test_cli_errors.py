"""Bad input on the command line: one clear line on stderr and exit 2, never a traceback,
and nothing silently wrong (a query's repeated column names, an unreadable file)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tracegen import transfer_records, write_jsonl

from hybridtrace.errors import UsageError
from hybridtrace.ingest.run import ingest
from hybridtrace.store.objects import ObjectRef

SCRIPT = Path(sys.executable).with_name("hybridtrace")


def write_trace(path: Path, requests: int) -> None:
    """A decode engine's trace: TP 2, so two reads and one request record per request."""
    write_jsonl(path, transfer_records(requests, tp=2))


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "hybridtrace"]
    env = {k: v for k, v in os.environ.items() if k != "HYBRIDTRACE_DEBUG"}
    return subprocess.run([*command, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=120)


def refused(result: subprocess.CompletedProcess, words: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert words in result.stderr, result.stderr


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    write_trace(root / "in" / "decode-0" / "trace.jsonl", requests=3)
    ingest([root / "in"], root / "store")
    return root / "store"


def test_query_keeps_repeated_column_names_apart(store):
    result = run("query", "SELECT 1 AS s, 2 AS s, 0.5 AS d, 1.0::DECIMAL(4, 1) AS e, uuid() AS u",
                 "--store", str(store), "--format", "json", cwd=store.parent)  # fmt: skip
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout)[0]
    assert (row["s"], row["s_2"], row["d"], row["e"]) == (1, 2, 0.5, 1)
    assert len(row["u"]) == 36


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("simulate", "--out", "x", "--rate", "inf"), "--rate"),
        (("simulate", "--out", "x", "--seed", "-1"), "--seed"),
        (("simulate", "--out", "x", "--median-prompt", "0"), "--median-prompt"),
        (("simulate", "--out", "x", "--duration", "1e400s"), "too large"),
        (("simulate", "--out", "x", "--format", "csv"), "not csv"),
        (("ingest", "in", "--store", "s", "--year", "0"), "--year"),
        (("analyze", "--store", "STORE", "--fail-on", "any,transfer_failed"), "'any' stands alone"),
        (("analyze", "--store", "STORE", "--fail-on", ","), "no kinds"),
        (("explain", "r-0", "--store", "STORE", "--format", "csv"), "not csv"),
        (("report", "--store", "STORE", "--out", "."), "is a folder"),
    ],
)
def test_bad_options_are_one_line_errors(tmp_path, store, args, words):
    (tmp_path / "in").mkdir()
    args = tuple(str(store) if a == "STORE" else a for a in args)
    refused(run(*args, cwd=tmp_path), words)


def test_simulate_and_demo_want_an_empty_folder(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("keep me")
    refused(run("simulate", "--out", "full", "--requests", "5", cwd=tmp_path), "not an empty folder")
    refused(run("demo", "--dir", "full", cwd=tmp_path), "not an empty folder")
    assert (tmp_path / "full" / "mine.txt").read_text() == "keep me"


def test_thresholds_out_of_range_and_misspelt_job_keys(tmp_path, store):
    (tmp_path / "t.toml").write_text("[thresholds]\nexcess_min_bytes = -1\n")
    refused(run("analyze", "--store", str(store), "--config", "t.toml", cwd=tmp_path), "at least 0")
    (tmp_path / "t.toml").write_text("[thresholds]\nwindow_s = 0\n")
    refused(run("analyze", "--store", str(store), "--config", "t.toml", cwd=tmp_path), "above 0")
    (tmp_path / "t.toml").write_text("thresholds = 5\n")
    refused(run("analyze", "--store", str(store), "--config", "t.toml", cwd=tmp_path), "must be a table")
    job = f'[inputs]\npaths = ["in"]\n[store]\npath = "{store}"\n[alert]\nfailon = ["any"]\n'
    (tmp_path / "job.toml").write_text(job)
    result = run("run", "--config", "job.toml", cwd=tmp_path)
    assert result.returncode == 2 and "unknown keys ['failon']" in result.stdout + result.stderr


def test_a_damaged_store_says_so(tmp_path, store):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "_meta.json").write_text("{not json")
    refused(run("query", "SELECT 1", "--store", str(broken), cwd=tmp_path), "damaged")


def test_a_table_folder_deleted_by_hand_is_not_an_empty_table(tmp_path, store):
    import shutil

    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    shutil.rmtree(copy / "transfers")
    result = run("analyze", "--store", str(copy), cwd=tmp_path)
    refused(result, "the manifest lists 6 rows of transfers, but no file of that table is left")
    # the store it was copied from still reads
    kept = run("query", "SELECT count(*) AS n FROM transfers", "--store", str(store), cwd=tmp_path)
    assert kept.returncode == 0, kept.stderr


def test_unreadable_objects_are_counted_and_fail_the_run(tmp_path, monkeypatch):
    write_trace(tmp_path / "in" / "decode-0" / "trace.jsonl", requests=2)
    (tmp_path / "in" / "decode-0" / "locked.log").write_text("x\n")
    real_open = ObjectRef.open

    def guarded(self):
        if self.uri.endswith("locked.log"):
            raise PermissionError(13, "Permission denied", self.uri)
        return real_open(self)

    monkeypatch.setattr(ObjectRef, "open", guarded)
    summary = ingest([tmp_path / "in"], tmp_path / "s")
    assert summary.errors == 1 and summary.rows["transfers"] == 4
    assert summary.error_messages == [f"{(tmp_path / 'in' / 'decode-0' / 'locked.log').resolve()}: "
                                      "cannot read: Permission denied"]  # fmt: skip


def test_an_unlistable_folder_is_an_error_row_not_a_gap(tmp_path, monkeypatch):
    write_trace(tmp_path / "in" / "decode-0" / "trace.jsonl", requests=2)
    ingest([tmp_path / "in"], tmp_path / "s")
    real_walk = os.walk

    def walk(top, onerror=None, followlinks=False):
        onerror(PermissionError(13, "Permission denied", str(Path(top) / "decode-0")))
        return iter([])  # the only folder with files cannot be read

    monkeypatch.setattr(os, "walk", walk)
    summary = ingest([tmp_path / "in"], tmp_path / "s")
    monkeypatch.setattr(os, "walk", real_walk)
    assert summary.errors == 1 and summary.objects_gone == 0  # unseen is not gone
    assert "cannot list: Permission denied" in summary.error_messages[0]


def test_explicit_usage_error_type():
    from hybridtrace.kinds import parse_kinds

    with pytest.raises(UsageError, match="stands alone"):
        parse_kinds("any,kv_expired", "--fail-on")


def test_a_store_inside_its_input_folder_is_not_read_as_input(tmp_path):
    write_trace(tmp_path / "in" / "decode-0" / "trace.jsonl", requests=2)
    ingest([tmp_path / "in"], tmp_path / "in" / "store")
    again = ingest([tmp_path / "in"], tmp_path / "in" / "store")
    assert again.objects_seen == 1 and again.by_format == {}


def test_a_damaged_data_file_is_exit_2_in_one_line_not_exit_1(tmp_path, store):
    # Exit 1 is "findings matched --fail-on": a scheduler must not read a damaged file as that.
    import shutil

    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    damaged = next(copy.glob("transfers/**/*.parquet"))
    damaged.write_bytes(damaged.read_bytes()[:100])
    for args in (("analyze",), ("query", "SELECT count(*) AS n FROM transfers")):
        refused(run(*args, "--store", str(copy), cwd=tmp_path), "cannot read the data")


def test_an_empty_fail_on_is_refused_by_analyze_as_by_run(tmp_path, store):
    refused(run("analyze", "--store", str(store), "--fail-on", "", cwd=tmp_path), "no kinds given")


def test_query_reads_the_thresholds_analyze_reads(tmp_path, store):
    # the finding views are the same in query as in analyze: ./hybridtrace.toml, or --config
    sql = "SELECT value FROM _thresholds WHERE name = 'prefill_tokens_per_s'"
    (tmp_path / "hybridtrace.toml").write_text("[thresholds]\nprefill_tokens_per_s = 10000\n")
    found = run("query", sql, "--store", str(store), "--format", "json", cwd=tmp_path)
    assert json.loads(found.stdout) == [{"value": 10000.0}], found.stderr
    (tmp_path / "other.toml").write_text("[thresholds]\nprefill_tokens_per_s = 5\n")
    found = run("query", sql, "--store", str(store), "--format=json", "--config=other.toml", cwd=tmp_path)
    assert json.loads(found.stdout) == [{"value": 5.0}], found.stderr


def test_a_rule_without_input_says_when_its_kind_was_found_from_native_metrics(tmp_path):
    # Prometheus only: the counters saw failures no trace or log names. The trace rule for
    # transfer_failed had no input, yet its kind was found: the summary says by which rule.
    from promgen import scrape

    folder = tmp_path / "in" / "decode-0"
    folder.mkdir(parents=True)
    (folder / "metrics-1.prom").write_text(scrape([], failed=0, timestamp_ms=1_764_400_000_000))
    (folder / "metrics-2.prom").write_text(scrape([], failed=2, timestamp_ms=1_764_400_600_000))
    ingest([tmp_path / "in"], tmp_path / "s")
    shown = run("analyze", "--store", str(tmp_path / "s"), cwd=tmp_path)
    assert "transfer_failed (its kind found by native_counters)" in shown.stdout, shown.stdout
    as_json = run("analyze", "--store", str(tmp_path / "s"), "--format=json", cwd=tmp_path)
    summary = json.loads(as_json.stdout)
    assert summary["summary"]["rules"]["native_counters"]["kinds"] == ["transfer_failed", "kv_expired"]


def test_one_missing_input_of_several_is_an_error_row_and_the_rest_is_read(tmp_path):
    write_trace(tmp_path / "in" / "decode-0" / "trace.jsonl", requests=2)
    missing = tmp_path / "not-mounted-yet"
    result = run("ingest", str(tmp_path / "in"), str(missing), "--store", str(tmp_path / "s"), cwd=tmp_path)
    refused(result, "not-mounted-yet: no such file or folder")
    counts = run("query", "SELECT (SELECT count(*) FROM transfers) AS t, "
                 "(SELECT count(*) FROM sources WHERE status = 'error') AS e", "--store", str(tmp_path / "s"),
                 "--format=json", cwd=tmp_path)  # fmt: skip
    assert json.loads(counts.stdout) == [{"t": 4, "e": 1}]
    # one input named, and missing: nothing to do but say so
    alone = run("ingest", str(missing), "--store", str(tmp_path / "s2"), cwd=tmp_path)
    refused(alone, "no such file or folder")


def test_a_hidden_folder_is_not_walked(tmp_path):
    write_trace(tmp_path / "in" / "decode-0" / "trace.jsonl", requests=2)
    write_trace(tmp_path / "in" / ".old" / "trace.jsonl", requests=5)  # e.g. a store or a backup
    (tmp_path / "in" / ".old" / "junk.bin").write_bytes(b"\x00\x01")
    summary = ingest([tmp_path / "in"], tmp_path / "s")
    assert summary.objects_seen == 1 and summary.rows["transfers"] == 4


def test_bad_model_leaves_no_store_behind(tmp_path):
    from hybridtrace.errors import HybridtraceError

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
    from hybridtrace.store import Store

    store = Store(tmp_path / "st")
    store.init()
    args = [a.replace("OUT", str(tmp_path / "o")).replace("STORE", str(tmp_path / "st")) for a in args]
    result = subprocess.run(
        [sys.executable, "-m", "hybridtrace", *args], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr and "error" in result.stderr
