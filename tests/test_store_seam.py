"""The store's one seam into the analysis, and the small pieces every command shares.

Every command that analyses a store opens it through ``open_analysis``; one rule decides
the exit code of ``analyze`` and ``run``; one helper publishes a report; one rule says
which engine an instance folder is; one view gives an engine's newest settings; tables
show byte counts with their human size.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from loggen import vllm_line
from tracegen import engine_record, transfer_records, write_jsonl
from typer.testing import CliRunner

import hybridtrace.store.analysis as analysis
from hybridtrace.cli import app
from hybridtrace.errors import UsageError
from hybridtrace.exit_codes import EXIT_ERROR, EXIT_FINDINGS, EXIT_OK, NOTHING_TO_ANALYZE, decide_exit
from hybridtrace.ingest.run import ingest
from hybridtrace.output import bytes_cell, bytes_text
from hybridtrace.simulate import SimOptions
from hybridtrace.store import NoStoreError, Store, open_analysis
from hybridtrace.store.instances import folder_engine_id
from hybridtrace.store.publish import publish_text


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("seam")
    write_jsonl(root / "in" / "decode-0" / "trace.jsonl",
                [engine_record("decode-0", "decode", 2), *transfer_records(6)])  # fmt: skip
    ingest([root / "in"], root / "s")
    return root / "s"


@pytest.fixture
def opened(monkeypatch) -> list[str]:
    """Every store ``open_analysis`` opens; any other way into the analysis fails the test."""
    calls: list[str] = []
    real = analysis.open_analysis

    def recording(store, **kwargs):
        calls.append(str(store))
        return real(store, **kwargs)

    def refused(self, **kwargs):
        raise AssertionError("a command opened the store without open_analysis")

    monkeypatch.setattr(analysis, "open_analysis", recording)
    monkeypatch.setattr(Store, "connect", refused)
    return calls


@pytest.mark.parametrize(
    "args",
    [
        ["query", "SELECT count(*) AS n FROM transfers"],
        ["analyze"],
        ["analyze", "--format", "json"],
        ["explain", "cmpl-0-0"],
        ["report", "--format", "md", "--out", "-"],
        ["model", "--link-from", "STORE"],
    ],
    ids=lambda a: " ".join(a[:3]),
)
def test_every_command_opens_the_store_through_open_analysis(store, opened, args):
    args = [str(store) if a == "STORE" else a for a in args]
    if "--link-from" not in args:
        args += ["--store", str(store)]
    result = CliRunner().invoke(app, args)
    # model --link-from needs 8 reads whose time grows with their bytes; 12 random ones may not fit
    assert result.exit_code in ((0, 2) if "--link-from" in args else (0,)), result.output
    assert opened == [str(store)]


def test_the_report_file_and_the_job_open_the_store_through_open_analysis(store, opened, tmp_path):
    from hybridtrace.job import JobConfig, run_job

    shown = CliRunner().invoke(app, ["report", "--store", str(store), "--out", str(tmp_path / "r.md"),
                                     "--format", "md"])  # fmt: skip
    assert shown.exit_code == 0, shown.output
    job_store = tmp_path / "job-store"
    write_jsonl(tmp_path / "in" / "decode-0" / "trace.jsonl", transfer_records(3))
    code, summary = run_job(JobConfig(paths=[str(tmp_path / "in")], store=str(job_store),
                                      markdown=str(tmp_path / "out" / "summary.md")))  # fmt: skip
    assert code == EXIT_OK and summary["status"] == "ok"
    assert opened == [str(store), str(job_store)]
    assert (tmp_path / "out" / "summary.md").read_text().strip()


def test_verify_takes_prompt_lengths_through_open_analysis(store, opened):
    from hybridtrace.verify import VerifyOptions, verify

    # nothing listens on port 9: the prompts cannot be compared, but the store was opened first
    options = VerifyOptions(pd="http://127.0.0.1:9", control="http://127.0.0.1:9", store=str(store),
                            prompts=None, lengths="p50", timeout_s=1, retries=0, progress=False)  # fmt: skip
    with pytest.raises(UsageError):
        verify(options)
    assert opened == [str(store)]


def test_no_store_is_one_clear_error(tmp_path):
    with pytest.raises(NoStoreError, match=r"no store here \(run 'hybridtrace ingest PATH --store"):
        open_analysis(tmp_path / "nothing")
    with pytest.raises(NoStoreError, match="no store here to take prompt lengths from"):
        open_analysis(tmp_path / "nothing", views=False, missing=" to take prompt lengths from")
    for args in (["query", "SELECT 1"], ["analyze"], ["explain", "r"], ["report"]):
        shown = CliRunner().invoke(app, [*args, "--store", str(tmp_path / "nothing")])
        # main() turns the error into one line and exit 2 (test_cli_errors runs it so)
        assert isinstance(shown.exception, NoStoreError) and shown.exception.exit_code == 2


def test_open_analysis_installs_the_thresholds_of_the_file_it_is_given(store, tmp_path):
    config = tmp_path / "hybridtrace.toml"
    config.write_text("[thresholds]\nslow_rank_ratio = 0.25\n")
    con = open_analysis(store, config=config)
    assert con.sql("SELECT value FROM _thresholds WHERE name = 'slow_rank_ratio'").fetchall() == [(0.25,)]
    assert con.sql("SELECT count(*) FROM engine_models").fetchall() == [(1,)]
    raw = open_analysis(store, views=False)  # raw views and engine models: no rule views
    assert raw.sql("SELECT count(*) FROM engine_models").fetchall() == [(1,)]
    assert not raw.sql("SELECT * FROM duckdb_views() WHERE view_name = 'finding_slow_rank'").fetchall()


def test_the_exit_code_rule():
    found, inputs = {"transfer_failed": 2, "kv_expired": 0}, {"transfers": 10, "intervals": 0}
    assert decide_exit(found, inputs).code == EXIT_OK
    assert decide_exit(found, inputs, fail_on={"kv_expired"}).code == EXIT_OK
    matched = decide_exit(found, inputs, fail_on={"transfer_failed", "kv_expired"})
    assert (matched.code, matched.status, matched.matched) == (EXIT_FINDINGS, "findings", ["transfer_failed"])
    empty = decide_exit(found, {"transfers": 0, "intervals": 0}, fail_on={"transfer_failed"}, strict=True)
    assert (empty.code, empty.status, empty.message) == (EXIT_ERROR, "nothing to analyze", NOTHING_TO_ANALYZE)
    assert decide_exit({}, {"transfers": 0, "intervals": 3}, strict=True).code == EXIT_OK
    unreadable = decide_exit(found, inputs, fail_on={"transfer_failed"}, unreadable=1)
    assert (unreadable.code, unreadable.status, unreadable.matched) == (
        EXIT_ERROR, "unreadable input", ["transfer_failed"])  # fmt: skip


def test_publish_replaces_the_target_whole_and_leaves_nothing_behind(tmp_path):
    target = tmp_path / "site" / "report.html"
    assert publish_text("first", target) == str(target)
    publish_text("second ✓", target)
    assert target.read_text(encoding="utf-8") == "second ✓"
    assert sorted(p.name for p in target.parent.iterdir()) == ["report.html"]
    with pytest.raises(UsageError, match="is a folder"):
        publish_text("x", tmp_path / "site")
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="cannot write the report"):
        publish_text("x", tmp_path / "file" / "report.html")  # a file where its folder should be


def test_byte_counts_in_tables_carry_their_human_size():
    assert bytes_cell(None) is None
    assert bytes_cell(512) == "512"
    assert bytes_cell(12_582_912) == "12,582,912 (12.00 MiB)"
    assert bytes_cell(3 * 2**30 + 2**29) == "3,758,096,384 (3.50 GiB)"
    assert bytes_text(4096) == "4,096 B (4.00 KiB)" and bytes_text(None) == "-"


def test_explain_and_analyze_tables_show_bytes_twice_json_once(store):
    table = CliRunner().invoke(app, ["explain", "cmpl-0-0", "--store", str(store)])
    assert table.exit_code == 0, table.output
    read = json.loads(CliRunner().invoke(app, ["explain", "cmpl-0-0", "--store", str(store),
                                              "--format", "json"]).output)["reads"][0]  # fmt: skip
    exact = read["transported_bytes"]
    assert isinstance(exact, int) and f"{exact:,} (" in table.output and "MiB)" in table.output
    analyzed = CliRunner().invoke(app, ["analyze", "--store", str(store)])
    summary = json.loads(CliRunner().invoke(app, ["analyze", "--store", str(store), "-f", "json"]).output)
    transported = summary["summary"]["transported_bytes"]
    assert isinstance(transported, int) and f"transported {transported:,} B (" in analyzed.output


def test_an_instance_folder_is_the_engine_its_log_names(tmp_path):
    class Obj:
        def __init__(self, folder: str, stem: str) -> None:
            self.folder, self.stem = folder, stem

    assert folder_engine_id(Obj("decode-0", "vllm")) == "decode-0"
    assert folder_engine_id(Obj("", "decode-7")) == "decode-7"
    early = [vllm_line("Starting vLLM API server", stamp="11-29 07:07:00")]
    for run in ("a", "b"):
        (tmp_path / "in" / run / "decode-0").mkdir(parents=True)
    (tmp_path / "in" / "a" / "decode-0" / "vllm.log").write_text("\n".join(early) + "\n")
    ingest([tmp_path / "in"], tmp_path / "s", year=2025)
    (tmp_path / "in" / "a" / "decode-0" / "vllm.log").write_text("\n".join(
        [*early, vllm_line("Initializing NIXL worker 4f1c", stamp="11-29 07:07:01")]) + "\n")  # fmt: skip
    (tmp_path / "in" / "b" / "decode-0" / "vllm.log").write_text("\n".join(early) + "\n")
    ingest([tmp_path / "in"], tmp_path / "s", year=2025)
    folders = Store(tmp_path / "s").connect(with_queries=False).sql(
        "SELECT regexp_extract(instance, '([^/]+/[^/]+)$', 1), folder, engine_id, engines_named "
        "FROM _instance_folders ORDER BY 1"
    ).fetchall()
    assert folders == [("a/decode-0", "decode-0", "4f1c", 1), ("b/decode-0", "decode-0", "decode-0", 0)]


def test_an_engines_newest_settings(tmp_path):
    records = [
        engine_record("d0", "decode", 2, ts=1764400000.0, kv_cache_dtype="bfloat16", model="old/model"),
        engine_record("d0", "decode", 4, ts=1764400200.0, kv_cache_dtype="fp8"),  # restarted, other flags
        engine_record("d0", "decode", 1, ts=1764400100.0),
    ]
    write_jsonl(tmp_path / "in" / "d0" / "trace.jsonl", records)
    ingest([tmp_path / "in"], tmp_path / "s")
    con = Store(tmp_path / "s").connect(with_queries=False)
    assert con.sql("SELECT count(*) FROM rejects").fetchall() == [(0,)]
    assert con.sql("SELECT engine_id, kv_cache_dtype, tp_size, model, block_tokens FROM _engine_newest"
                   ).fetchall() == [("d0", "fp8", 4, "nvidia/NVIDIA-Nemotron-Nano-12B-v2", 672)]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"era": "modern"}, "--era must be abort or lease"),
        ({"requests": 0}, "--requests must be at least 1"),
        ({"request_rate": float("nan")}, "--rate must be a positive number"),
        ({"median_prompt_tokens": 0}, "--median-prompt must be at least 1 token"),
        ({"cache_hit_rate": 1.5}, "--cache-hit-rate must be between 0 and 1"),
        ({"seed": -1}, "--seed -1: give a whole number"),
        ({"duration_s": 0.0}, "--duration must be positive"),
        ({"decode_engines": 0}, "--prefill and --decode need at least one engine each"),
    ],
)
def test_simulator_options_check_themselves(change, message):
    SimOptions().check()
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        SimOptions(**change).check()


def test_the_old_module_paths_name_the_store_packages_objects():
    """``hybridtrace.buckets``, ``.storage`` and ``.attach`` are kept for older imports, and are no copies."""
    import hybridtrace.attach as attach
    import hybridtrace.buckets as buckets
    import hybridtrace.storage as storage
    from hybridtrace.store import engine_models, leases, objects, roots

    for name in ("ObjectRef", "is_bucket", "list_objects", "redact", "refuse_credentials", "bucket"):
        assert getattr(buckets, name) is getattr(objects, name)
    assert (storage.LocalRoot, storage.BucketRoot, storage.root_of) == (roots.LocalRoot, roots.BucketRoot,
                                                                         roots.root_of)  # fmt: skip
    assert storage.LeaseHeld is leases.LeaseHeld and attach.engine_models is engine_models.engine_models
