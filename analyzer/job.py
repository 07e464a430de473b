"""``hybridtrace run --config job.toml``: the scheduled job — ingest, analyze, report, alert.

One run reads what is new under the configured inputs (folders or bucket prefixes),
updates the store, runs the analysis, writes the report (to a path or a bucket) and
returns an exit code by the configured policy, with a one-line JSON summary for the
scheduler's log. A run lock keeps overlapping runs apart: the second one steps aside
(status ``skipped``) unless the holder has run longer than ``max_run_s``, which means a
stuck run — then it fails loudly (exit 2) so the schedule alerts.

The job file::

    [inputs]
    paths = ["s3://telemetry/prod/vllm/", "/var/log/vllm"]
    model = "nemotron-nano-12b-v2"      # optional: the config every engine serves
    tz = "UTC"                          # optional: time zone of vLLM log stamps

    [store]
    path = "/var/lib/hybridtrace/store"                # or a bucket prefix: s3://…, gs://…

    [report]
    html = "s3://telemetry/reports/hybridtrace.html"   # a path or a bucket URI
    markdown = "/var/lib/hybridtrace/summary.md"       # optional

    [alert]
    fail_on = ["transfer_failed", "kv_expired"]        # or "any"; exit 1 when found
    strict = true                                      # exit 2 when nothing was analyzable
    lease_s = 300                                      # a dead run's lock expires after this (buckets)
    max_run_s = 3600                                   # a run holding the lock longer is stuck

    [thresholds]                                       # optional, as in hybridtrace.toml
    slow_rank_ratio = 0.6

    [spark]                                            # optional: ingest, analysis on Spark (docs/spark.md)
    master = "yarn"                                    # or remote = "sc://host:15002"; neither:
    spark.executor.memory = "4g"                       # spark-submit's session
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hybridtrace.errors import UsageError
from hybridtrace.exit_codes import EXIT_ERROR, EXIT_FINDINGS, EXIT_OK, decide_exit
from hybridtrace.kinds import parse_kinds
from hybridtrace.store.leases import LeaseHeld
from hybridtrace.store.objects import is_bucket, refuse_credentials
from hybridtrace.store.roots import root_of
from hybridtrace.toml_files import read_toml
from hybridtrace.verify_job import VerifyStep, judge, load_verify_step, run_verify_step

if TYPE_CHECKING:
    from hybridtrace.spark.session import SparkOptions

__all__ = ["EXIT_ERROR", "EXIT_FINDINGS", "EXIT_OK", "Busy", "JobConfig", "load_job", "run_job", "run_lock"]


@dataclass
class JobConfig:
    paths: list[str]
    store: str
    model: str | None = None
    tz: str = "UTC"
    year: int | None = None
    html: str | None = None
    markdown: str | None = None
    fail_on: set[str] = field(default_factory=set)
    strict: bool = False
    lease_s: float = 300.0
    max_run_s: float = 3600.0
    thresholds_file: str | None = None  # the job file itself, when it has [thresholds]
    verify: VerifyStep | None = None  # [verify]: compare outputs with a control before the analysis
    spark: SparkOptions | None = None  # [spark]: ingest and request-scope rules on Spark (--engine spark)


_KEYS = {
    "inputs": ("paths", "model", "tz", "year"),
    "store": ("path",),
    "report": ("html", "markdown"),
    "alert": ("fail_on", "strict", "lease_s", "max_run_s"),
}


def _section(raw: dict, name: str, path: Path) -> dict:
    value = raw.get(name, {})
    if not isinstance(value, dict):
        raise UsageError(f"{path}: [{name}] must be a table")
    unknown = sorted(set(value) - set(_KEYS[name]))
    if unknown:  # a misspelt key would silently turn a setting (an alert, a report) off
        raise UsageError(f"{path}: [{name}] has unknown keys {unknown} (known: {', '.join(_KEYS[name])})")
    return value


def load_job(path: str | Path) -> JobConfig:
    """Read and check a job file; every mistake is a one-line UsageError."""
    path = Path(path)
    raw = read_toml(path, "job file")
    known = {"inputs", "store", "report", "alert", "thresholds"}
    known.add("verify")  # checked by hybridtrace.verify_job
    known.add("spark")  # checked by hybridtrace.spark.session
    unknown = sorted(set(raw) - known)
    if unknown:
        raise UsageError(f"{path}: unknown sections {unknown} (known: {', '.join(sorted(known))})")
    inputs, store = _section(raw, "inputs", path), _section(raw, "store", path)
    report, alert = _section(raw, "report", path), _section(raw, "alert", path)
    paths = inputs.get("paths")
    if isinstance(paths, str):
        paths = [paths]
    if not paths or not all(isinstance(p, str) for p in paths):
        raise UsageError(f"{path}: [inputs] paths must list at least one folder or bucket prefix")
    if not isinstance(store.get("path"), str):
        raise UsageError(f"{path}: [store] path is required")
    fail_on = alert.get("fail_on", [])
    if not isinstance(fail_on, (str, list)) or not all(isinstance(k, str) for k in fail_on):
        raise UsageError(f"{path}: [alert] fail_on must be a list of kinds or \"any\"")
    listed = fail_on if isinstance(fail_on, str) else ",".join(fail_on)
    # absent: no alert; present, it must name kinds (an empty list would silence the alert)
    kinds = parse_kinds(listed, f"{path}: [alert] fail_on") if "fail_on" in alert else set()
    year = inputs.get("year")
    if year is not None and (isinstance(year, bool) or not isinstance(year, int) or not 1970 <= year <= 9999):
        raise UsageError(f"{path}: [inputs] year must be a whole number from 1970 to 9999, not {year!r}")

    def number(section: dict, key: str, default: float) -> float:
        value = section.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise UsageError(f"{path}: {key} must be a positive number of seconds, not {value!r}")
        return float(value)

    strict = alert.get("strict", False)
    if not isinstance(strict, bool):
        raise UsageError(f"{path}: [alert] strict must be true or false, not {strict!r}")
    for key, value in (("html", report.get("html")), ("markdown", report.get("markdown")),
                       ("model", inputs.get("model")), ("tz", inputs.get("tz"))):  # fmt: skip
        if value is not None and not isinstance(value, str):
            raise UsageError(f"{path}: {key} must be a string, not {value!r}")
    for where in (*paths, store["path"], report.get("html"), report.get("markdown")):
        if where is not None and is_bucket(where):
            # refused now, not after the ingest and analysis when the report is published
            refuse_credentials(where)
    if "thresholds" in raw:
        # checked now, not after the ingest has written the store and the report is due
        from hybridtrace.analyze.thresholds import load as load_thresholds

        load_thresholds(path)
    verify_step = load_verify_step(raw.get("verify"), path, store["path"])
    spark = None
    if "spark" in raw:
        from hybridtrace.spark.session import job_spark_options

        spark = job_spark_options(raw["spark"], str(path))
    return JobConfig(
        paths=list(paths),
        store=store["path"],
        model=inputs.get("model"),
        tz=inputs.get("tz", "UTC"),
        year=inputs.get("year"),
        html=report.get("html"),
        markdown=report.get("markdown"),
        fail_on=kinds,
        strict=strict,
        lease_s=number(alert, "lease_s", 300),
        max_run_s=number(alert, "max_run_s", 3600),
        thresholds_file=str(path) if "thresholds" in raw else None,
        verify=verify_step,
        spark=spark,
    )


class Busy(Exception):
    """Another run holds the lock (``stuck`` when it has run longer than ``max_run_s``)."""

    def __init__(self, holder: dict, stuck: bool) -> None:
        super().__init__(holder)
        self.holder, self.stuck = holder, stuck


@contextlib.contextmanager
def run_lock(store: str, lease_s: float, max_run_s: float = 3600.0) -> Iterator[None]:
    """Hold the store's run lock for a whole run.

    A file lock for a local store (the system releases it when a run dies); a lease for
    a bucket store (renewed while the run lives, expired ``lease_s`` after it dies). The
    lock names its holder and start, so the next run can tell a long run from a stuck one.
    """
    try:
        with root_of(store).lock(".run.lock", lease_s, "an earlier run still holds the run lock"):
            yield
    except LeaseHeld as held:
        started = held.holder.get("started")
        if not (isinstance(started, int | float) and math.isfinite(started)):
            started = time.time()  # a claim that does not say when it started is not stuck
        raise Busy(held.holder, stuck=time.time() - started > max_run_s) from None


def run_job(config: JobConfig) -> tuple[int, dict]:
    """One scheduled run: (exit code, the one-line summary as a dict)."""
    from hybridtrace.analyze import analyze
    from hybridtrace.ingest.run import ingest
    from hybridtrace.report import collect, render_html, render_markdown
    from hybridtrace.store.analysis import open_analysis
    from hybridtrace.store.publish import publish_text

    started = time.monotonic()
    summary: dict = {"status": "ok", "store": config.store}
    try:
        with run_lock(config.store, config.lease_s, config.max_run_s):
            read_objects = None
            if config.spark is not None:
                from hybridtrace.spark.ingest import SparkReader

                read_objects = SparkReader(config.spark)
            ingested = ingest(config.paths, config.store, year=config.year, tz=config.tz, model=config.model,
                              read_objects=read_objects)  # fmt: skip
            summary["objects"] = {
                "seen": ingested.objects_seen, "read": ingested.objects_read,
                "unchanged": ingested.objects_skipped, "gone": ingested.objects_gone,
                "left_out": ingested.objects_left_out,
            }  # fmt: skip
            summary["rows"] = sum(ingested.rows.values())
            summary["rejects"] = ingested.rejects
            if ingested.errors:
                summary["unreadable"] = ingested.errors
                summary["message"] = "; ".join(ingested.error_messages)
            if config.verify is not None:
                # after the ingest, before the analysis: the report sees this run's comparisons
                summary["verify"] = run_verify_step(config.verify)
            scope = None
            if config.spark is not None:  # the request-scope rules on Spark too
                from hybridtrace.spark.analysis import SparkScope

                scope = SparkScope(config.spark)
            con = open_analysis(config.store, config=config.thresholds_file)
            # the analysis keeps its state in the store: each run recomputes what its batches touch
            if config.html or config.markdown:
                data = collect(con, store=config.store, config=config.thresholds_file, scope=scope,
                               incremental=True)  # fmt: skip
                analysis = data.analysis
            else:
                # no report to write: the analysis alone, not the report's sections, which
                # read every request of the store again (seconds a run on a month of data)
                analysis = analyze(con, config=config.thresholds_file, scope=scope, incremental=True)
            by_kind = {k: n for k, n in analysis.summary["findings_by_kind"].items() if n}
            summary["findings"] = len(analysis)
            summary["by_kind"] = by_kind
            summary["by_severity"] = analysis.summary["findings_by_severity"]
            if config.html:
                summary["report"] = publish_text(render_html(data), config.html)
            if config.markdown:
                summary["markdown"] = publish_text(render_markdown(data), config.markdown)
    except Busy as busy:
        holder = busy.holder
        since = time.time() - float(holder.get("started", time.time()))
        summary["status"] = "stuck" if busy.stuck else "skipped"
        summary["holder"] = {k: holder.get(k) for k in ("host", "pid")}
        summary["held_s"] = round(since, 1)
        summary["seconds"] = round(time.monotonic() - started, 3)
        return (EXIT_ERROR if busy.stuck else EXIT_OK), summary
    # unreadable input still leaves the rest read, analysed and published; the operator must know
    outcome = decide_exit(by_kind, analysis.inputs, fail_on=config.fail_on, strict=config.strict,
                          unreadable=ingested.errors)  # fmt: skip
    summary["fail_on_matched"] = outcome.matched
    code, summary["status"] = outcome.code, outcome.status
    if config.verify is not None:  # the verify step's own policy
        code, summary["status"] = judge(summary["verify"], code, summary["status"])
        if summary["status"] == "verify error":
            summary.setdefault("message", summary["verify"].get("message"))
    summary["seconds"] = round(time.monotonic() - started, 3)
    return code, summary
