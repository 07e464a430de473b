"""The report's content: self-contained, escaped, bounded in size, honest about empty inputs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hybridtrace.ingest.run import ingest
from hybridtrace.report import collect, render_html, render_markdown, write_report
from hybridtrace.simulate import SimOptions, parse_inject, simulate
from hybridtrace.store import Store

EVIL = "<script>alert(1)</script>"
ENGINE = "dec<b>ode"
SCRIPT = Path(sys.executable).with_name("hybridtrace")


def _evil_trace(folder: Path) -> None:
    """A tiny trace whose request id is markup, and whose read failed (so a finding names it)."""
    base = {"v": 1, "ts": 1764400000.0}
    records = [
        {**base, "type": "engine", "engine_id": ENGINE, "role": "decode", "tp_size": 1},
        {**base, "type": "engine", "engine_id": "p", "role": "prefill", "tp_size": 1},
        {**base, "type": "request", "request_id": EVIL, "engine_id": ENGINE, "remote_engine_id": "p",
         "missing_tokens": 100, "transferred_tokens": 100, "reused_tokens": 100, "state_blocks": 1,
         "status": "failed"},
        {**base, "type": "transfer", "request_id": EVIL, "engine_id": ENGINE, "remote_engine_id": "p",
         "rank": 0, "tp_size": 1, "remote_rank": 0, "remote_tp_size": 1, "status": "failed",
         "post_s": 0.001, "xfer_s": 0.002, "bytes": 0, "descriptors": 4, "staging_bytes": 0},
    ]  # fmt: skip
    folder.mkdir(parents=True)
    (folder / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_page_is_self_contained(demo_store, tmp_path):
    path, data = write_report(demo_store, tmp_path / "r.html")
    html = path.read_text()
    # nothing is fetched: no external script, stylesheet, image or frame (script bodies are
    # code, not markup: the inlined Vega bundle holds tag templates of its own)
    assert re.findall(r"<script\b[^>]*\bsrc\s*=", html, re.I) == []
    markup = re.sub(r"(?is)<script\b[^>]*>.*?</script>", "", html)
    assert re.findall(r"<(?:link|img|iframe|object|embed)\b[^>]*\b(?:src|href|data)\s*=", markup, re.I) == []
    assert "vegaEmbed" in html and html.count('<script type="application/json"') == 7
    # every section the issue lists is on the page
    for anchor in ("summary", "bytes-by-cache", "payload", "ranks", "link-fit", "descriptors", "recompute",
                   "intervals", "engines", "findings", "docs"):  # fmt: skip
        assert f'id="{anchor}"' in html
    # each kind that was found links to its docs page, carried in the page
    for kind, n in data.summary["findings_by_kind"].items():
        if n:
            assert f'href="#doc-{kind}"' in html and f'id="doc-{kind}"' in html


def test_link_fit_chart_draws_each_rank_s_reads_and_its_fitted_line(demo_store):
    from hybridtrace.report.charts import link_fit

    con = Store(demo_store).connect()
    data = collect(con, store="s")
    fits = con.sql(
        "SELECT engine_id, rank, transfers_used, fixed_s, bandwidth_bytes_per_s, bytes_per_descriptor, "
        "per_descriptor_s FROM link_fits WHERE scope = 'rank' ORDER BY rank"
    ).fetchall()
    assert len(fits) == 2  # the simulated decode engine's two ranks, one route
    chart = link_fit(data)
    assert chart is not None and chart.key == "link-fit"
    datasets = list(chart.spec["datasets"].values())
    assert data.link_fit_points in datasets and data.link_fit_lines in datasets
    by_fit: dict[str, list[dict]] = {}
    for point in data.link_fit_points:
        by_fit.setdefault(point["fit"], []).append(point)
    assert len(by_fit) == 2
    for (engine, rank, used, fixed, bandwidth, per_byte_desc, per_desc), label in zip(fits, sorted(by_fit),
                                                                                      strict=True):
        assert label.startswith(f"{engine} ← ") and f"· rank {rank}" in label
        points = by_fit[label]
        # a sample of the reads the fit used: up to 300, each a read of that rank
        assert len(points) == min(300, used)
        reads = {(b, round(ms, 9)) for b, ms in con.sql(
            "SELECT transported_bytes, xfer_s * 1e3 FROM transfers WHERE status = 'ok' AND xfer_s > 0 "
            "AND engine_id = ? AND rank = ?", params=[engine, rank]).fetchall()}  # fmt: skip
        assert {(p["bytes"], round(p["xfer_ms"], 9)) for p in points} <= reads
        # the line: at no bytes the fixed cost, at the most bytes drawn the fitted time
        start, end = (line for line in data.link_fit_lines if line["fit"] == label)
        top = max(p["bytes"] for p in points)
        assert (start["bytes"], end["bytes"]) == (0, top)
        assert start["xfer_ms"] == pytest.approx(fixed * 1e3)
        descriptor_s = top / per_byte_desc * per_desc if per_desc else 0.0
        assert end["xfer_ms"] == pytest.approx((fixed + top / bandwidth + descriptor_s) * 1e3)
    # the rank slow_rank names is the one whose fitted bandwidth is lowest (the steeper line)
    slowest = min(fits, key=lambda f: f[4])[1]
    assert con.sql("SELECT rank FROM finding_slow_rank").fetchall() == [(slowest,)]


def test_strings_from_logs_are_text_not_markup(tmp_path):
    _evil_trace(tmp_path / "in")
    ingest([tmp_path / "in"], tmp_path / "s")
    path, data = write_report(tmp_path / "s", tmp_path / "r.html")
    assert any(f["request_id"] == EVIL for f in data.findings)
    html = path.read_text()
    assert EVIL not in html and ENGINE not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    note = render_markdown(data)
    assert EVIL not in note and "\\<script\\>alert\\(1\\)" in note  # shown as text, not markup


def test_empty_store_says_there_is_nothing_to_draw(tmp_path):
    ingest([], tmp_path / "s")
    html = render_html(collect(Store(tmp_path / "s").connect(), store="s"))
    assert '<div class="chart"' not in html
    assert "Nothing to draw for" in html and "No findings" in html


def test_native_only_store_draws_the_timeline(tmp_path):
    simulate(SimOptions(seed=4, duration_s=40), tmp_path / "b")
    for trace in (tmp_path / "b").rglob("trace.jsonl"):
        trace.unlink()
    ingest([tmp_path / "b"], tmp_path / "s")
    data = collect(Store(tmp_path / "s").connect(), store="s")
    html = render_html(data)
    assert 'id="chart-intervals"' in html and 'id="chart-payload"' not in html
    assert "byte counts come from native metrics only" in html


def test_charts_sample_so_the_page_stays_small(tmp_path):
    # 3,000 requests at TP 2 is 6,000 reads: more than the 4,000 the scatter plots keep.
    simulate(SimOptions(seed=5, requests=3000, inject=parse_inject("padding_leak=0.5")), tmp_path / "b")
    ingest([tmp_path / "b"], tmp_path / "s")
    data = collect(Store(tmp_path / "s").connect(), store="s")
    assert data.counts["reads_ok"] > 4000 and len(data.reads) == 4000
    assert len({r["request_id"] for r in data.request_bytes}) <= 40
    assert data.counts["findings"] > 500 and len(data.findings) == 500
    path, _ = write_report(tmp_path / "s", tmp_path / "r.html")
    assert path.stat().st_size < 4_000_000
    text = path.read_text()
    assert "500 of" in text and "with every kind that was found" in text
    # the 500 are not the most frequent kinds alone: every kind found has its part
    found = {k for k, n in data.analysis.summary["findings_by_kind"].items() if n}
    assert {f["kind"] for f in data.findings} == found


def test_cli_report_and_markdown(demo_store, tmp_path):
    command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "hybridtrace"]
    out = tmp_path / "page.html"
    done = subprocess.run([*command, "report", "--html", "--store", str(demo_store), "--out", str(out)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(str(out)) and out.exists()
    md = subprocess.run([*command, "report", "--format", "md", "--store", str(demo_store), "--out", "-"],
                        capture_output=True, text=True)  # fmt: skip
    assert md.returncode == 0 and md.stdout.startswith("### hybridtrace:")
    assert "| transported |" in md.stdout
    bad = subprocess.run([*command, "report", "--store", str(tmp_path / "nowhere")],
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "no store here" in bad.stderr and "Traceback" not in bad.stderr


def test_model_lines_are_per_read_when_a_rank_reads_several_prefill_ranks(tmp_path):
    # Prefill TP 4 into decode TP 2: each decode rank makes two reads per request, each
    # with half its bytes; the byte model's lines are drawn for one read.
    simulate(SimOptions(seed=8, requests=300, prefill_tp=(4,), decode_tp=(2,)), tmp_path / "b")
    ingest([tmp_path / "b"], tmp_path / "s")
    con = Store(tmp_path / "s").connect()
    top = con.sql(
        "SELECT l.share, l.expected_bytes, b.expected_bytes FROM report_model_lines l "
        "JOIN (SELECT engine_id, max(transferred_tokens) AS t FROM transfer_bytes GROUP BY ALL) m "
        "ON m.engine_id = l.engine_id AND l.tokens = m.t "
        "JOIN transfer_bytes b ON b.engine_id = l.engine_id AND b.transferred_tokens = m.t"
    ).fetchall()
    assert top and all(share == 2 and line == read for share, line, read in top)


def test_descriptors_are_drawn_for_reads_no_byte_model_sizes(tmp_path):
    from tracegen import engine_record, transfer_records, write_jsonl

    unknown = {"model": "acme/unknown-hybrid"}
    records = [engine_record("decode-0", "decode", 2) | unknown]
    records.append(engine_record("prefill-0", "prefill", 2) | unknown)
    write_jsonl(tmp_path / "in" / "decode-0" / "trace.jsonl", records + transfer_records(20, tp=2))
    ingest([tmp_path / "in"], tmp_path / "s")
    data = collect(Store(tmp_path / "s").connect(), store="s")
    assert len(data.reads) == 40 and all(r["expected_bytes"] is None for r in data.reads)
    html = render_html(data)
    assert 'id="chart-descriptors"' in html and 'id="chart-payload"' not in html
    assert "no engine that made the reads could be sized" in html


def test_findings_are_grouped_by_kind_above_the_full_table(tmp_path):
    """Each kind found: its count over all findings, its severities, its worst few with evidence."""
    from hybridtrace.report.data import KIND_EXAMPLES

    simulate(SimOptions(seed=8, duration_s=20, inject={"transfer_failed": 0.3, "padding_leak": 0.3}),
             tmp_path / "b")  # fmt: skip
    ingest([tmp_path / "b"], tmp_path / "s")
    data = collect(Store(tmp_path / "s").connect(), store="s")
    found = {k: n for k, n in data.summary["findings_by_kind"].items() if n}
    assert {g["kind"]: g["count"] for g in data.kind_groups} == found
    for group in data.kind_groups:
        assert sum(group["by_severity"].values()) == group["count"]
        assert 1 <= len(group["worst"]) <= KIND_EXAMPLES
        assert all(f["kind"] == group["kind"] for f in group["worst"])
        assert all("evidence_text" in f for f in group["worst"])
    severities = ["error", "warning", "info"]
    firsts = [severities.index(next(iter(g["by_severity"]))) for g in data.kind_groups]
    assert firsts == sorted(firsts)  # the most severe kinds first
    html = render_html(data)
    grouped, table = html.index('id="findings-by-kind"'), html.index('id="findings-table"')
    assert grouped < table
    for group in data.kind_groups:
        assert f'id="kind-{group["kind"]}"' in html[grouped:table]


def test_report_with_no_logical_bytes(tmp_path):
    from tracegen import engine_record, transfer_records, write_jsonl

    records = [engine_record("decode-0", "decode", 2), *transfer_records(3)]
    for record in records:
        if record["type"] == "request":
            record.pop("transferred_tokens", None)
    write_jsonl(tmp_path / "in" / "trace.jsonl", records)
    ingest([tmp_path / "in"], tmp_path / "s", model="nemotron-nano-12b-v2")
    data = collect(Store(tmp_path / "s").connect(), store="s")
    assert "hybridtrace report" in render_html(data) and render_markdown(data).startswith("### hybridtrace")


def test_a_report_whose_request_scope_is_computed_elsewhere_equals_one_computed_here(demo_store):
    # the path of `report --engine spark` without Spark: the report's shared views are made
    # into tables, then the analysis swaps some of them for its merged state and makes tables
    # of its own; the report must read its copies back afterwards (a table of the same name
    # once replaced the report's copy of _rank_windows, and the report failed)
    from hybridtrace.store.analysis import open_analysis

    here = collect(open_analysis(demo_store), store=str(demo_store))
    elsewhere = collect(
        open_analysis(demo_store), store=str(demo_store), scope=lambda run: run.compute_scope()
    )
    assert elsewhere.analysis.summary == here.analysis.summary
    assert elsewhere.analysis.table.equals(here.analysis.table)
    assert elsewhere.ranks == here.ranks
    assert elsewhere.engines == here.engines


def _sections(data) -> dict:
    """Every section of a report's data, comparable (not when it was generated). Floats to 12
    digits: DuckDB sums doubles in parallel, in an order that can move the last digit."""

    def rounded(value):
        if isinstance(value, float):
            return float(f"{value:.12g}")
        if isinstance(value, dict):
            return {k: rounded(v) for k, v in value.items()}
        if isinstance(value, list):
            return [rounded(v) for v in value]
        return value

    fields = {k: v for k, v in vars(data).items() if k not in ("generated", "analysis")}
    fields["summary"] = data.analysis.summary
    fields["findings table"] = data.analysis.table.to_pylist()
    return rounded(json.loads(json.dumps(fields, default=str, sort_keys=True)))


def test_the_scheduled_jobs_report_from_the_analysis_state_equals_one_over_every_read(tmp_path):
    """The job's report (an incremental analysis, the per-request sums read from its state and
    only the drawn requests' reads sized) equals a report over every read: after the first run,
    after a run that merged new reads with the stored ones, and with nothing new."""
    from hybridtrace.store.analysis import open_analysis

    bundle = tmp_path / "b"
    # a decode rank reads from two prefill ranks: the byte model lines are drawn per read
    simulate(SimOptions(seed=8, requests=500, prefill_tp=(4,), decode_tp=(2,), inject=parse_inject("all")),
             str(bundle))  # fmt: skip
    trace = (bundle / "decode-0" / "trace.jsonl").read_text().splitlines(keepends=True)
    grown = tmp_path / "in"
    shutil.copytree(bundle, grown)
    store = tmp_path / "s"
    for share in (0.5, 1.0, None):  # None: no new object
        if share is not None:
            (grown / "decode-0" / "trace.jsonl").write_text("".join(trace[: int(len(trace) * share)]))
            ingest([grown], store, progress=False)
        job = collect(open_analysis(store), store=str(store), incremental=True)
        whole = collect(open_analysis(store), store=str(store))
        assert _sections(job) == _sections(whole)
        assert job.request_bytes and job.reads and job.model_lines and job.recompute
        assert job.counts["requests_accounted"] > 0 and job.counts["handoffs_compared"] > 0
        assert any(rank["slow"] for rank in job.ranks)
    runs = Store(store).connect(with_queries=False).sql("SELECT full_run FROM analysis_runs ORDER BY seq")
    assert runs.fetchall() == [(True,), (False,)]  # the last report had nothing new to analyze
