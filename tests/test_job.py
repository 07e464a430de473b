"""`hybridtrace run --config job.toml`: the scheduled job, its exit codes and its one-line summary."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import servers

from hybridtrace.job import JobConfig, load_job, run_job, run_lock
from hybridtrace.simulate import SimOptions, parse_inject, simulate

SCRIPT = Path(sys.executable).with_name("hybridtrace")
COMMAND = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "hybridtrace"]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("job") / "bundle"
    simulate(SimOptions(seed=9, duration_s=30, inject=parse_inject("transfer_failed=0.05")), root)
    return root


def _job(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


def _run(job: Path, env: dict | None = None) -> tuple[int, dict, str]:
    done = subprocess.run([*COMMAND, "run", "--config", str(job)], capture_output=True, text=True,
                          env=servers.environ_with(env or {}), timeout=300)  # fmt: skip
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout  # one machine-readable line, nothing else
    return done.returncode, json.loads(lines[0]), done.stderr


def test_local_job_reports_and_alerts(tmp_path, bundle):
    job = _job(tmp_path, f"""
[inputs]
paths = ["{bundle}"]
[store]
path = "{tmp_path / 'store'}"
[report]
html = "{tmp_path / 'out' / 'report.html'}"
markdown = "{tmp_path / 'out' / 'summary.md'}"
[alert]
fail_on = ["transfer_failed"]
strict = true
[thresholds]
slow_rank_ratio = 0.5
""")
    code, summary, _ = _run(job)
    assert code == 1 and summary["status"] == "findings" and summary["fail_on_matched"] == ["transfer_failed"]
    assert summary["objects"]["read"] > 0 and summary["by_kind"]["transfer_failed"] > 0
    assert Path(summary["report"]).read_text().startswith("<!DOCTYPE html>")
    assert (tmp_path / "out" / "summary.md").read_text().startswith("### hybridtrace:")
    # the next run reads nothing new and says the same
    code, again, _ = _run(job)
    assert code == 1 and again["objects"]["read"] == 0 and again["findings"] == summary["findings"]
    # --fail-on overrides the job's policy
    done = subprocess.run([*COMMAND, "run", "--config", str(job), "--fail-on", "slow_rank"],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0 and json.loads(done.stdout)["fail_on_matched"] == []


@pytest.mark.servers
def test_bucket_inputs_and_report(tmp_path, bundle):
    if os.environ.get("HYBRIDTRACE_REQUIRE_SERVERS") != "1":  # CI: moto must be there
        pytest.importorskip("moto.server")
    with servers.moto_s3() as s3:
        s3.make_bucket("telemetry")
        for file in sorted(p for p in bundle.rglob("*") if p.is_file()):
            s3.put(f"telemetry/prod/{file.relative_to(bundle)}", file.read_bytes())
        job = _job(tmp_path, f"""
[inputs]
paths = ["s3://telemetry/prod/"]
[store]
path = "{tmp_path / 'store'}"
[report]
html = "s3://telemetry/reports/latest.html"
""")
        code, summary, stderr = _run(job, s3.env)
        assert code == 0 and summary["status"] == "ok", stderr
        assert summary["report"] == "s3://telemetry/reports/latest.html"
        with s3.filesystem.open_input_file("telemetry/reports/latest.html") as page:
            assert b"hybridtrace report" in page.read()
        assert s3.env["AWS_SECRET_ACCESS_KEY"] not in json.dumps(summary) + stderr


def test_overlapping_runs_step_aside_and_a_stuck_one_alerts(tmp_path, bundle):
    config = JobConfig(paths=[str(bundle)], store=str(tmp_path / "store"))
    with run_lock(config.store, config.lease_s):
        code, summary = run_job(config)
        assert (code, summary["status"]) == (0, "skipped") and summary["holder"]["pid"]
        config.max_run_s = 0  # the holder has run longer than a run may: stuck
        code, summary = run_job(config)
        assert (code, summary["status"]) == (2, "stuck")
    config.max_run_s = 3600
    code, summary = run_job(config)  # released: this one runs
    assert code == 0 and summary["status"] == "ok"


def test_bad_job_files_and_nothing_to_analyze(tmp_path):
    code, summary, stderr = _run(_job(tmp_path, "[inputs]\npaths = []\n[store]\npath = 'x'\n"))
    assert code == 2 and summary["status"] == "error" and "paths must list" in stderr
    code, summary, _ = _run(_job(tmp_path, "[input]\npaths = ['x']\n"))
    assert code == 2 and "unknown sections" in summary["message"]
    with pytest.raises(Exception, match="unknown kinds"):
        load_job(_job(tmp_path, "[inputs]\npaths=['a']\n[store]\npath='s'\n[alert]\nfail_on=['nope']\n"))
    (tmp_path / "empty").mkdir()
    job = _job(tmp_path, f"[inputs]\npaths = ['{tmp_path / 'empty'}']\n[store]\npath = '{tmp_path / 's'}'\n"
                         "[alert]\nstrict = true\n")  # fmt: skip
    code, summary, _ = _run(job)
    assert code == 2 and summary["status"] == "nothing to analyze"


def test_a_job_file_is_checked_whole_before_anything_is_written(tmp_path):
    # a year out of range, or a misspelt threshold, is refused before the store exists
    base = f"[inputs]\npaths = ['{tmp_path}']\n[store]\npath = '{tmp_path / 's'}'\n"
    with pytest.raises(Exception, match="year must be a whole number from 1970 to 9999"):
        load_job(_job(tmp_path, base.replace("[store]", "year = 0\n[store]")))
    with pytest.raises(Exception, match="unknown threshold 'slow_rank_ration'"):
        load_job(_job(tmp_path, base + "[thresholds]\nslow_rank_ration = 0.5\n"))
    with pytest.raises(Exception, match="lease_s must be a positive number of seconds"):
        load_job(_job(tmp_path, base + "[alert]\nlease_s = 0\n"))  # a lease that never holds
    assert not (tmp_path / "s").exists()


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
    from hybridtrace.errors import UsageError

    with pytest.raises(UsageError, match="strict must be true or false"):
        load_job(job)


def test_each_run_keeps_the_analysis_state_and_analyzes_only_what_is_new(tmp_path, bundle):
    # The job analyses as `hybridtrace analyze` does: a run keeps its findings and rollups in
    # the store, the next one recomputes only what its batches touch; the report it writes
    # counts what a full analysis of the store finds.
    from hybridtrace.analyze import analyze
    from hybridtrace.store import Store

    store = tmp_path / "store"
    inputs = tmp_path / "in"
    inputs.mkdir()
    for part in ("models", "prefill-0"):
        shutil.copytree(bundle / part, inputs / part)

    def run() -> dict:
        report = tmp_path / "s.md"
        text = f'[inputs]\npaths = ["{inputs}"]\n[store]\npath = "{store}"\n[report]\nmarkdown = "{report}"\n'
        code, summary = run_job(load_job(_job(tmp_path, text)))
        assert code in (0, 1) and summary["rows"] >= 0, summary
        full = analyze(Store(store).connect())
        assert summary["findings"] == len(full) and summary["by_kind"] == {
            k: n for k, n in full.summary["findings_by_kind"].items() if n
        }
        con = Store(store).connect(with_queries=False)
        return {"read": summary["objects"]["read"], "findings": summary["findings"]} | dict(zip(
            ("runs", "full", "requests"), con.sql(
            "SELECT count(*), bool_or(full_run) FILTER (WHERE seq = (SELECT max(seq) FROM analysis_runs)), "
            "max_by(requests, seq) FROM analysis_runs").fetchall()[0], strict=True))  # fmt: skip

    first = run()
    assert first["read"] > 0  # the prefill side alone: no decode reads, no findings yet
    assert first["runs"] == 1 and first["full"]  # no state yet: everything, and kept
    assert run()["runs"] == 1  # nothing new: nothing recomputed, nothing written
    shutil.copytree(bundle / "decode-0", inputs / "decode-0")
    grown = run()
    assert grown["read"] > 0 and grown["findings"] > first["findings"]
    assert grown["runs"] == 2 and not grown["full"] and grown["requests"] > 0


def test_a_job_without_a_report_analyses_alike_and_gathers_no_report(tmp_path, bundle, monkeypatch):
    # With no report to write, a run analyses and judges as one that writes it does, and does
    # not gather the report's sections (they read every request of the store again).
    import hybridtrace.report

    def job(name: str, report: str) -> dict:
        store = tmp_path / name / "store"
        text = f'[inputs]\npaths = ["{bundle}"]\n[store]\npath = "{store}"\n{report}'
        code, summary = run_job(load_job(_job(tmp_path / name, text)))
        return {"code": code} | {k: summary[k] for k in ("status", "findings", "by_kind", "by_severity")}

    (tmp_path / "with").mkdir()
    (tmp_path / "without").mkdir()
    reported = job("with", f'[report]\nmarkdown = "{tmp_path / "with" / "r.md"}"\n')

    def refused(*args, **kwargs):
        raise AssertionError("the report's sections were gathered")

    monkeypatch.setattr(hybridtrace.report, "collect", refused)
    assert job("without", "") == reported
    assert reported["findings"] > 0 and not list((tmp_path / "without").glob("*.md"))
