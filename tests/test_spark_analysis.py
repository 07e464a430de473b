"""The Spark tier, analysis: ``analyze``, ``report`` and ``run`` with ``--engine spark`` on
``local[2]`` find what ``--engine local`` finds.

The store holds several days and decode engines (a simulated bundle across midnight) and
requests that share prefill request ids across engines (a trace of its own: two decode
engines reading from two prefill engines that reuse one another's ids, some expired, a
request id both decoders used), with slow-rank windows that cross the day edge (a
7-second window). Findings, input counts and the summary must be equal: identical ids,
counts and byte counts, floats within 1e-9 relative; so must the incremental state each
engine writes, and a second, incremental analysis after more data. One SparkSession
serves the module.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tracegen import engine_record, record, release_record, write_jsonl
from typer.testing import CliRunner

from hybridtrace.analyze import analyze
from hybridtrace.cli import app
from hybridtrace.ingest.run import ingest
from hybridtrace.simulate import SimOptions, simulate
from hybridtrace.store import Store
from hybridtrace.store.analysis import open_analysis

MIDNIGHT = 1_776_816_000.0  # 2026-04-22 00:00:00 UTC
# A state row's run stamp; everything else of the state must be equal.
STATE_PER_RUN = {"ran_at", "batches"}


def _scope(spark):
    from hybridtrace.spark.analysis import SparkScope

    return SparkScope(session=spark)


def shared_prefill_trace(path: Path, start: float, n: int = 12) -> Path:
    """Two decoders, two prefill engines that hand out the same prefill ids: ``p-k`` is read
    by decode-a from prefill-x and by decode-b from prefill-y; some expire (a release on one
    prefill engine), and one request id is used by both decoders."""
    records = [
        engine_record(e, role, 2, ts=start - 30)
        for e, role in (("decode-a", "decode"), ("decode-b", "decode"), ("prefill-x", "prefill"),
                        ("prefill-y", "prefill"))
    ]  # fmt: skip
    for k in range(n):
        ts = start + k * 3.0
        for decoder, prefill in (("decode-a", "prefill-x"), ("decode-b", "prefill-y")):
            rid = "both" if k == 5 else f"{decoder}-{k}"
            expired = k % 4 == 1
            for rank in range(2):
                records.append(record(
                    "transfer", ts=ts + rank * 1e-4, request_id=rid, remote_request_id=f"p-{k}",
                    engine_id=decoder, remote_engine_id=prefill, rank=rank, tp_size=2, remote_rank=rank,
                    remote_tp_size=2, status="expired" if expired else "ok", post_s=0.0005,
                    xfer_s=0.003 + 0.001 * rank, bytes=400 * 3072 + 9433088, descriptors=100,
                    staging_bytes=0, link="rdma:mlx5_0",
                ))  # fmt: skip
            records.append(record(
                "request", ts=ts + 0.05, request_id=rid, remote_request_id=f"p-{k}", engine_id=decoder,
                remote_engine_id=prefill, prompt_tokens=401, cached_tokens=0, missing_tokens=400,
                transferred_tokens=400, reused_tokens=400, recomputed_tokens=1, state_blocks=1,
                boundary_tokens=400, status="expired" if expired else "ok",
            ))  # fmt: skip
        if k % 3 == 0:
            records.append(release_record("prefill-x", f"p-{k}", ts + 1))  # decode-a's only
    return write_jsonl(path, records)


def _bundle(root: Path, *, seed: int = 11, start: float = MIDNIGHT - 60, requests: int = 160) -> Path:
    bundle = root / f"bundle-{seed}"
    inject = {"kv_expired": 0.05, "transfer_failed": 0.05}
    simulate(SimOptions(seed=seed, prefill_engines=2, decode_engines=2, requests=requests, duration_s=120,
                        start_ts=start, inject=inject), bundle)  # fmt: skip
    shared_prefill_trace(bundle / "shared" / "trace.jsonl", start + 40)
    return bundle


def close(a: object, b: object, where: str = "") -> None:
    """Equal, floats within 1e-9 relative (JSON text compared as what it parses to)."""
    if isinstance(a, str) and isinstance(b, str) and a[:1] in "{[" and a != b:
        with contextlib.suppress(ValueError):
            a, b = json.loads(a), json.loads(b)
    if isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0) or (math.isnan(a) and math.isnan(b)), where
    elif isinstance(a, dict) and isinstance(b, dict):
        assert sorted(a) == sorted(b), where
        for key in a:
            close(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            close(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _state(root: Path) -> dict[str, list[dict]]:
    con = open_analysis(root, views=False)
    out = {}
    for table in (
        "analysis_findings", "analysis_requests", "analysis_rank_windows", "analysis_counts", "analysis_runs"
    ):
        rows = con.sql(f"SELECT * FROM {table}").arrow().read_all().to_pylist()
        rows = [{k: v for k, v in r.items() if k not in STATE_PER_RUN} for r in rows]
        out[table] = sorted(rows, key=lambda r: json.dumps(r, default=str, sort_keys=True))
    return out


def _config(root: Path) -> str:
    path = root / "hybridtrace.toml"
    path.write_text("[thresholds]\nwindow_s = 7\nslow_rank_min_reads = 1\n")
    return str(path)


@pytest.mark.spark
def test_days_engines_shared_prefill_ids(spark, tmp_path):
    bundle = _bundle(tmp_path)
    ingest([bundle], tmp_path / "local")
    shutil.copytree(tmp_path / "local", tmp_path / "spark")
    con = open_analysis(tmp_path / "local")
    days = con.sql("SELECT count(DISTINCT day), count(DISTINCT engine_id) FROM transfers").fetchall()[0]
    assert days[0] == 2 and days[1] >= 4  # two days, the simulated decoders and decode-a, decode-b
    shared = con.sql(
        "SELECT count(*) FROM (SELECT remote_request_id FROM request_records GROUP BY ALL "
        "HAVING count(DISTINCT engine_id) > 1)"
    ).fetchall()[0][0]
    assert shared > 0
    config = _config(tmp_path)
    scope = _scope(spark)
    local = analyze(open_analysis(tmp_path / "local", config=config), config=config, incremental=True)
    on_spark = analyze(open_analysis(tmp_path / "spark", config=config), config=config, incremental=True,
                       scope=scope)  # fmt: skip
    assert scope.parts > 1  # the work was split
    kinds = local.summary["findings_by_kind"]
    assert kinds["kv_expired"] > 0 and kinds["transfer_failed"] > 0
    close(on_spark.as_dict(), local.as_dict())
    # a window crossing midnight: its reads are in two days' folders, and counted together
    crossing = con.execute(
        "SELECT count(*) FROM (SELECT floor(ts / 7) AS w FROM transfers GROUP BY ALL "
        "HAVING count(DISTINCT day) > 1)"
    ).fetchall()[0][0]
    assert crossing > 0
    close(_state(tmp_path / "spark"), _state(tmp_path / "local"))

    # more data (the next minutes): an incremental run on each engine, equal again
    more = _bundle(tmp_path, seed=12, start=MIDNIGHT + 200)
    for name in ("local", "spark"):
        ingest([more], tmp_path / name)
    local = analyze(open_analysis(tmp_path / "local", config=config), config=config, incremental=True)
    on_spark = analyze(open_analysis(tmp_path / "spark", config=config), config=config, incremental=True,
                       scope=scope)  # fmt: skip
    close(on_spark.as_dict(), local.as_dict())
    close(_state(tmp_path / "spark"), _state(tmp_path / "local"))


def _json(result) -> dict:
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


@pytest.mark.spark
@pytest.mark.servers
def test_bucket_ingest_analyze_cli(spark, spark_s3, tmp_path):
    bundle = _bundle(tmp_path, requests=60)
    for path in sorted(p for p in bundle.rglob("*") if p.is_file()):
        spark_s3.put(f"telemetry/in/{path.relative_to(bundle)}", path.read_bytes())
    runner = CliRunner()
    prefix = spark_s3.uri("telemetry/in")
    stores = {e: spark_s3.uri(f"telemetry/store-{e}") for e in ("local", "spark")}
    for engine, store in stores.items():
        extra = ["--engine", "spark", "--spark-master", "local[2]"] if engine == "spark" else []
        got = runner.invoke(app, ["ingest", prefix, "--store", store, "-q", "--format", "json", *extra])
        assert got.exit_code == 0, got.output
    results = {}
    for engine, store in stores.items():
        extra = ["--engine", "spark", "--spark-master", "local[2]"] if engine == "spark" else []
        results[engine] = _json(runner.invoke(app, ["analyze", "--store", store, "--format", "json", *extra]))
    assert results["local"]["summary"]["findings"] > 0
    close(results["spark"], results["local"])
    # the executors opened the store in the bucket through their own environment, and the
    # driver wrote the state as a local run does
    assert Store(stores["spark"]).committed_files("analysis_runs")


@pytest.mark.spark
def test_report_engine_spark(spark, tmp_path):
    bundle = _bundle(tmp_path, requests=60)
    ingest([bundle], tmp_path / "store")
    runner = CliRunner()
    out = {}
    for engine in ("local", "spark"):
        extra = ["--engine", "spark", "--spark-master", "local[2]"] if engine == "spark" else []
        got = runner.invoke(app, ["report", "--store", str(tmp_path / "store"), "--format", "md",
                                  "--out", str(tmp_path / f"{engine}.md"), *extra])  # fmt: skip
        assert got.exit_code == 0, got.output
        out[engine] = got.stdout
        text = (tmp_path / f"{engine}.md").read_text()
        # the header line says when the report was made (to the minute): the rest must be equal
        out[engine] = [line for line in text.splitlines() if not line.startswith("Store `")]
    assert out["spark"] == out["local"]
    # the report writes no analysis state, whichever engine ran its rules
    assert not Store(tmp_path / "store").committed_files("analysis_runs")


@pytest.mark.spark
def test_run_engine_spark(spark, tmp_path):
    bundle = _bundle(tmp_path, requests=60)
    summaries = {}
    for engine in ("local", "spark"):
        spark_table = '\n[spark]\nmaster = "local[2]"\n' if engine == "spark" else ""
        job = tmp_path / f"{engine}.toml"
        job.write_text(
            f'[inputs]\npaths = ["{bundle}"]\n[store]\npath = "{tmp_path / engine}"\n'
            f'[report]\nhtml = "{tmp_path / engine}.html"\n{spark_table}'
        )
        got = CliRunner().invoke(app, ["run", "--config", str(job)])
        assert got.exit_code == 0, got.output
        summaries[engine] = json.loads(got.stdout.strip().splitlines()[-1])
    for key in ("findings", "by_kind", "by_severity", "rows", "rejects"):
        assert summaries["spark"][key] == summaries["local"][key], key
    assert summaries["local"]["findings"] > 0
    assert os.path.getsize(tmp_path / "spark.html") > 0


@pytest.mark.spark
def test_analyze_spark_connect_equals_local(connect_server, tmp_path):
    """--spark-remote: the parts computed through Spark Connect (in a process of its own,
    since this one holds a classic session) find what a local analysis finds, and write the
    same incremental state."""
    bundle = _bundle(tmp_path, requests=60)
    ingest([bundle], tmp_path / "local")
    shutil.copytree(tmp_path / "local", tmp_path / "spark")
    config = _config(tmp_path)
    results = {}
    for engine in ("local", "spark"):
        extra = ["--engine", "spark", "--spark-remote", connect_server] if engine == "spark" else []
        run = subprocess.run(
            [sys.executable, "-m", "hybridtrace", "analyze", "--store", str(tmp_path / engine),
             "--config", config, "--format", "json", *extra],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert run.returncode in (0, 1), run.stderr[-2000:]
        results[engine] = json.loads(run.stdout)
    assert results["local"]["summary"]["findings"] > 0
    close(results["spark"], results["local"])
    close(_state(tmp_path / "spark"), _state(tmp_path / "local"))
