"""The ``hybridtrace`` command line: options in, a library call, shared output out.

Every command turns its options into arguments of a library function and prints the
result through ``hybridtrace.output``. Errors a user can fix print one line on stderr
and exit 2; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from hybridtrace import __version__
from hybridtrace.errors import HybridtraceError, UsageError
from hybridtrace.model import (
    DEFAULT_MODEL,
    SizingOptions,
    builtin_names,
    crossover_tokens,
    geometry_from_config,
    load_config,
    raw_byte_model,
    size_model,
    worksheet,
)
from hybridtrace.output import OutputFormat, to_json
from hybridtrace.units import format_bytes, parse_bytes, parse_duration, parse_int_list, parse_rate

if TYPE_CHECKING:
    from hybridtrace.spark.analysis import SparkScope
    from hybridtrace.spark.ingest import SparkReader
    from hybridtrace.spark.session import SparkOptions

app = typer.Typer(
    name="hybridtrace",
    help="Byte accounting for hybrid-model KV and state transfers in disaggregated vLLM + NIXL serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_state = {"debug": False}


def _keep_freed_pages() -> None:
    """Have polars' allocator keep the pages it frees, for a command that makes data in blocks.

    polars allocates through its own jemalloc, which hands freed pages back to the kernel
    soon after a block is done, only to fault them in again for the next one: the simulator
    spends about 0.8 s less in the kernel per million requests when they are kept. Read when
    polars loads, so it has no effect once polars is imported; a setting of the user's wins.
    """
    os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:-1,muzzy_decay_ms:-1")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"hybridtrace {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    _state["debug"] = debug or bool(os.environ.get("HYBRIDTRACE_DEBUG"))


FormatOption = Annotated[OutputFormat, typer.Option("--format", "-f", help="Output format.")]


def _fitted_link(store: str, pair: str | None, rank: int | None, link: str | None) -> dict:
    """The link model fitted from a store's reads, for ``model --link-from``."""
    from hybridtrace.analyze.link_fit import fit_from_store
    from hybridtrace.store.analysis import open_analysis

    engines = None
    if pair is not None:
        engines = tuple(p.strip() for p in pair.split(","))
        if len(engines) != 2 or not all(engines):
            raise UsageError("--pair takes PREFILL,DECODE engine ids")
    fit, used = fit_from_store(open_analysis(store), pair=engines, rank=rank, link=link)
    if fit is None or fit.bandwidth_bytes_per_s is None:
        raise UsageError(f"cannot fit a link from {used} in {store}: at least 8 reads whose time grows "
                         "with their bytes are needed")
    return {**fit.as_dict(), "from": used}


@app.command("model")
def model_command(
    config: Annotated[
        str | None,
        typer.Argument(
            help=f"A config.json, a folder holding one, or a built-in model ({', '.join(builtin_names())}).",
            show_default=False,
        ),
    ] = None,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel size; figures are per rank.")] = 1,
    kv_dtype: Annotated[
        str, typer.Option(help="KV cache dtype: auto, bfloat16, float16, float32, fp8 (fp8_e4m3, fp8_e5m2).")
    ] = "auto",
    mamba_dtype: Annotated[
        str,
        typer.Option(help="Conv state dtype (and SSM state unless --ssm-dtype is given or the family "
                          "fixes it, as vLLM does: Nemotron-H keeps a float32 SSM state)."),
    ] = "auto",
    ssm_dtype: Annotated[str, typer.Option(help="SSM (temporal) state dtype.")] = "auto",
    mamba_cache_mode: Annotated[
        str, typer.Option(help="none | align | all (all = Mamba prefix caching).")
    ] = "none",
    block_align: Annotated[int, typer.Option(help="Attention kernel block multiple.")] = 16,
    num_spec_tokens: Annotated[int, typer.Option(help="Speculative tokens (widen the conv state).")] = 0,
    missing_tokens: Annotated[
        str, typer.Option(help="Missing-prefix lengths for the worksheet, comma-separated.")
    ] = "512,4096,32768",
    state_blocks: Annotated[int, typer.Option(help="J: state snapshots the decoder pulls.")] = 1,
    bandwidth: Annotated[str, typer.Option(help="Effective link bandwidth (not the peak label).")] = "20GB/s",
    fixed_cost: Annotated[str, typer.Option(help="Fixed post + completion cost per transfer.")] = "80us",
    link_from: Annotated[
        str | None,
        typer.Option(help="Fit --bandwidth and --fixed-cost from the reads in this store instead."),
    ] = None,
    pair: Annotated[
        str | None, typer.Option(help="With --link-from: PREFILL,DECODE engine ids (default: every pair).")
    ] = None,
    rank: Annotated[int | None, typer.Option(help="With --link-from: one decode TP rank.")] = None,
    link: Annotated[str | None, typer.Option(help="With --link-from: one route (the trace's link).")] = None,
    attention_bytes_per_token: Annotated[
        str | None, typer.Option(help="Raw mode: B per rank, e.g. 4KiB (no config needed).")
    ] = None,
    state_bytes: Annotated[str | None, typer.Option(help="Raw mode: S per rank, e.g. 2.57MiB.")] = None,
    fmt: FormatOption = OutputFormat.table,
) -> None:
    """The byte model of one model per TP rank, and the transfer worksheet."""
    tokens = parse_int_list(missing_tokens)
    if state_blocks < 0:
        raise UsageError("--state-blocks cannot be negative")
    if tp < 1:
        raise UsageError("--tp must be at least 1")
    rate = parse_rate(bandwidth)
    fixed = parse_duration(fixed_cost)
    fitted = _fitted_link(link_from, pair, rank, link) if link_from else None
    if fitted is not None:
        rate, fixed = fitted["bandwidth_bytes_per_s"] or rate, fitted["fixed_s"]
    elif pair or rank is not None or link:
        raise UsageError("--pair, --rank and --link narrow --link-from: give a store")
    raw = attention_bytes_per_token is not None or state_bytes is not None
    if raw and config is not None:
        raise UsageError("give either a config or --attention-bytes-per-token/--state-bytes, not both")
    if raw:
        model = raw_byte_model(
            parse_bytes(attention_bytes_per_token or 0), parse_bytes(state_bytes or 0), tp_size=tp
        )
    else:
        options = SizingOptions(
            tp_size=tp,
            kv_dtype=kv_dtype,
            mamba_dtype=mamba_dtype,
            ssm_dtype=ssm_dtype,
            mamba_cache_mode=mamba_cache_mode,
            block_align=block_align,
            num_spec_tokens=num_spec_tokens,
        )
        cfg, name = load_config(config or DEFAULT_MODEL)
        model = size_model(geometry_from_config(cfg, name), options)
    rows = worksheet(model, tokens, state_blocks, rate, fixed)
    crossover = crossover_tokens(model, state_blocks)
    result = model.as_dict()
    result["crossover_tokens"] = round(crossover, 2) if crossover is not None else None
    result["state_blocks"] = state_blocks
    result["bandwidth_bytes_per_s"] = rate
    result["fixed_cost_s"] = fixed
    if fitted is not None:
        result["link_fit"] = fitted
    result["worksheet"] = [r.as_dict() for r in rows]
    if fmt is OutputFormat.json:
        typer.echo(to_json(result))
    elif fmt is OutputFormat.csv:
        from hybridtrace.output import to_csv

        typer.echo(to_csv(result["worksheet"]).rstrip("\n"))
    else:
        from hybridtrace.text.model import model_text

        typer.echo(model_text(result))


StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store", help="Store root (default ./hybridtrace-data or $HYBRIDTRACE_STORE).", show_default=False
    ),
]


def _spark_engine(
    engine: str, master: str | None, remote: str | None, conf: list[str]
) -> SparkOptions | None:
    """The Spark settings of ``--engine spark`` (None for local, the default)."""
    if engine == "local":
        if master or remote or conf:
            raise UsageError("--spark-master, --spark-remote and --spark-conf go with --engine spark")
        return None
    if engine != "spark":
        raise UsageError(f"--engine {engine}: give local or spark")
    from hybridtrace.spark.session import spark_options

    settings = {}
    for item in conf:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--spark-conf {item}: give KEY=VALUE")
        settings[key.strip()] = value.strip()
    return spark_options(master, remote, settings)


def _ingest_engine(
    engine: str, master: str | None, remote: str | None, conf: list[str]
) -> SparkReader | None:
    """The ``read_objects`` of ``--engine spark`` (None for local, the default)."""
    options = _spark_engine(engine, master, remote, conf)
    if options is None:
        return None
    from hybridtrace.spark.ingest import SparkReader

    return SparkReader(options)


def _analysis_engine(
    engine: str, master: str | None, remote: str | None, conf: list[str]
) -> SparkScope | None:
    """The analysis' ``scope`` for ``--engine spark`` (None for local, the default)."""
    options = _spark_engine(engine, master, remote, conf)
    if options is None:
        return None
    from hybridtrace.spark.analysis import SparkScope

    return SparkScope(options)


EngineOption = Annotated[
    str, typer.Option(help="Where the request-scope rules run: local (this process) or spark (executors).")
]
SparkMasterOption = Annotated[
    str | None, typer.Option(help="Spark master for --engine spark: local[2], spark://…, yarn, k8s://…")
]
SparkRemoteOption = Annotated[
    str | None, typer.Option(help="Spark Connect server for --engine spark: sc://host:15002.")
]
SparkConfOption = Annotated[
    list[str] | None, typer.Option(help="A spark.* setting for --engine spark, KEY=VALUE (repeatable).")
]


@app.command("ingest")
def ingest_command(
    paths: Annotated[
        list[str],
        typer.Argument(help="Files, folders or bucket prefixes (s3://…, gs://…); formats found by content."),
    ],
    store: StoreOption = None,
    year: Annotated[
        int | None,
        typer.Option(help="Year of a log's first line (default: from the file's modification time)."),
    ] = None,
    tz: Annotated[str, typer.Option(help="Time zone of vLLM log stamps.")] = "UTC",
    model: Annotated[
        str | None,
        typer.Option(help="config.json (or built-in name) every engine serves, whatever it is called."),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress, summary only.")] = False,
    fmt: FormatOption = OutputFormat.table,
    engine: Annotated[
        str, typer.Option(help="Where objects are parsed: local (this process) or spark (executors).")
    ] = "local",
    spark_master: Annotated[
        str | None, typer.Option(help="Spark master for --engine spark: local[2], spark://…, yarn, k8s://…")
    ] = None,
    spark_remote: Annotated[
        str | None, typer.Option(help="Spark Connect server for --engine spark: sc://host:15002.")
    ] = None,
    spark_conf: Annotated[
        list[str] | None, typer.Option(help="A spark.* setting for --engine spark, KEY=VALUE (repeatable).")
    ] = None,
) -> None:
    """Read telemetry into the store's Parquet tables; re-runs read only what is new."""
    from hybridtrace.ingest.run import ingest
    from hybridtrace.store import default_store

    _no_csv(fmt, "ingest")
    if year is not None and not 1970 <= year <= 9999:
        raise UsageError(f"--year {year}: give a year between 1970 and 9999")
    read_objects = _ingest_engine(engine, spark_master, spark_remote, spark_conf or [])
    summary = ingest(
        paths,
        store or default_store(),
        progress=not quiet and sys.stderr.isatty(),
        year=year,
        tz=tz,
        model=model,
        read_objects=read_objects,
    )
    result = summary.as_dict()
    # what could be read is in the store; what could not is an error the exit code says
    failed = typer.Exit(2) if summary.errors else None
    if fmt is OutputFormat.json:
        typer.echo(to_json(result))
        if failed:
            raise failed
        return
    from hybridtrace.text.ingest import ingest_text

    typer.echo(ingest_text(summary))
    for message in summary.left_out_messages:  # said on the run that first lists them
        typer.echo(f"hybridtrace: skipped: {message}", err=True)
    for message in summary.error_messages:
        typer.echo(f"hybridtrace: error: {message}", err=True)
    if failed:
        raise failed


@app.command("query")
def query_command(
    sql: Annotated[str, typer.Argument(help="DuckDB SQL over the store's views (transfers, requests, ...).")],
    store: StoreOption = None,
    fmt: FormatOption = OutputFormat.table,
    config: Annotated[str | None, typer.Option(help="hybridtrace.toml with a \\[thresholds] table.")] = None,
) -> None:
    """Run ad-hoc SQL against the store's views."""
    import duckdb

    from hybridtrace.output import render_rows
    from hybridtrace.store import default_store
    from hybridtrace.store.analysis import open_analysis

    # the finding views read their thresholds as analyze does (--config, else ./hybridtrace.toml)
    con = open_analysis(store or default_store(), config=config)
    try:
        relation = con.sql(sql)
        if relation is None:
            return
        columns = _unique_names(relation.columns)
        rows = [dict(zip(columns, r, strict=True)) for r in relation.fetchall()]
    except duckdb.Error as exc:
        raise UsageError(f"query failed: {exc}") from exc
    typer.echo(render_rows(rows, fmt, columns))


@app.command("iceberg")
def iceberg_command(store: StoreOption = None, fmt: FormatOption = OutputFormat.table) -> None:
    """Publish the store as Iceberg tables, now and after every later commit (docs/iceberg.md)."""
    from hybridtrace.output import render_rows
    from hybridtrace.store import Store, default_store
    from hybridtrace.store.iceberg import enable

    rows = enable(Store(store or default_store()))
    typer.echo(render_rows(rows, fmt, ["table", "files", "metadata"]))


def _no_csv(fmt: OutputFormat, command: str) -> None:
    """Commands whose output is one nested document print it as a table or as JSON."""
    if fmt is OutputFormat.csv:
        raise UsageError(f"{command} prints a table or json, not csv (try --format json)")


def _unique_names(names: list[str]) -> list[str]:
    """Column names, a repeated one numbered (status, status_2): rows are keyed by name."""
    taken: set[str] = set()
    unique = []
    for name in names:
        candidate, n = name, 1
        while candidate in taken:
            n += 1
            candidate = f"{name}_{n}"
        taken.add(candidate)
        unique.append(candidate)
    return unique


@app.command("analyze")
def analyze_command(
    store: StoreOption = None,
    fmt: FormatOption = OutputFormat.table,
    fail_on: Annotated[
        str | None,
        typer.Option(help="Exit 1 when any finding of these kinds (comma-separated, or 'any') is found."),
    ] = None,
    strict: Annotated[
        bool, typer.Option(help="Exit 2 when there is nothing to analyze (no transfers and no intervals).")
    ] = False,
    config: Annotated[
        str | None,
        typer.Option(help="hybridtrace.toml with a \\[thresholds] table (default: ./hybridtrace.toml)."),
    ] = None,
    limit: Annotated[int, typer.Option(help="Findings shown in the table (json and csv show all).")] = 40,
    full: Annotated[
        bool, typer.Option("--full", help="Recompute every finding instead of only what new batches touch.")
    ] = False,
    engine: EngineOption = "local",
    spark_master: SparkMasterOption = None,
    spark_remote: SparkRemoteOption = None,
    spark_conf: SparkConfOption = None,
) -> None:
    """Run the finding rules over the store and print the findings."""
    from hybridtrace.analyze import analyze
    from hybridtrace.exit_codes import EXIT_ERROR, decide_exit
    from hybridtrace.kinds import parse_kinds
    from hybridtrace.output import to_csv
    from hybridtrace.store import default_store
    from hybridtrace.store.analysis import open_analysis
    from hybridtrace.text.analysis import analysis_text

    # an empty --fail-on is refused, as `run` refuses it: a script's empty $KINDS must not
    # turn alerting off without a word
    kinds = parse_kinds(fail_on, "--fail-on") if fail_on is not None else set()
    scope = _analysis_engine(engine, spark_master, spark_remote, spark_conf or [])
    result = analyze(open_analysis(store or default_store(), config=config), config=config, incremental=True,
                     full=full, scope=scope)  # fmt: skip
    if fmt is OutputFormat.json:
        typer.echo(to_json(result.as_dict()))
    elif fmt is OutputFormat.csv:
        columns = ["kind", "severity", "engine_id", "rank", "request_id", "remote_engine_id"]
        columns += ["start_ts", "end_ts", "message", "evidence"]
        typer.echo(to_csv(result.findings, columns).rstrip("\n"))
    else:
        typer.echo(analysis_text(result, limit))
    outcome = decide_exit(result.summary["findings_by_kind"], result.inputs, fail_on=kinds, strict=strict)
    if outcome.code == EXIT_ERROR and outcome.message:
        typer.echo(f"hybridtrace: error: {outcome.message}", err=True)
    if outcome.code:
        raise typer.Exit(outcome.code)


@app.command("report")
def report_command(
    store: StoreOption = None,
    html: Annotated[bool, typer.Option("--html", help="Write the HTML page (the default).")] = False,
    fmt: Annotated[
        str, typer.Option("--format", "-f", help="html, or md for a short Markdown summary.")
    ] = "html",
    out: Annotated[
        str | None,
        typer.Option(help="Where to write it (default: report.html or report.md; '-' prints Markdown)."),
    ] = None,
    config: Annotated[
        str | None,
        typer.Option(help="hybridtrace.toml with a \\[thresholds] table (default: ./hybridtrace.toml)."),
    ] = None,
    engine: EngineOption = "local",
    spark_master: SparkMasterOption = None,
    spark_remote: SparkRemoteOption = None,
    spark_conf: SparkConfOption = None,
) -> None:
    """One self-contained HTML page (charts, findings, engines), or a Markdown summary."""
    from hybridtrace.report import collect, render_markdown, write_report
    from hybridtrace.store import default_store
    from hybridtrace.store.analysis import open_analysis

    if fmt not in ("html", "md"):
        raise UsageError(f"--format: {fmt!r} is not html or md")
    if html and fmt == "md":
        raise UsageError("--html and --format md ask for two different reports: pick one")
    root = store or default_store()
    if out == "-" and fmt != "md":
        raise UsageError("--out - prints the Markdown summary only (add --format md)")
    scope = _analysis_engine(engine, spark_master, spark_remote, spark_conf or [])
    if out == "-":
        con = open_analysis(root, config=config)
        typer.echo(render_markdown(collect(con, store=str(root), config=config, scope=scope)), nl=False)
        return
    path, data = write_report(root, out or f"report.{fmt}", fmt=fmt, config=config, scope=scope)
    size = path.stat().st_size
    typer.echo(
        f"{path} ({format_bytes(size)}): {data.counts['findings']:,} findings over "
        f"{data.inputs['transfers']:,} reads and {data.inputs['intervals']:,} intervals"
    )


@app.command("run")
def run_command(
    config: Annotated[
        str, typer.Option("--config", "-c", help="The job file (TOML): inputs, store, report, alert.")
    ],
    fail_on: Annotated[
        str | None,
        typer.Option(help="Kinds that make the run exit 1 (comma-separated, or 'any'); overrides the job's."),
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(help="local or spark: where objects are parsed and the request-scope rules run "
                          "(default: spark when the job has a [spark] table)."),
    ] = None,
    spark_master: SparkMasterOption = None,
    spark_remote: SparkRemoteOption = None,
    spark_conf: SparkConfOption = None,
) -> None:
    """The scheduled job: ingest what is new, analyze, publish the report, exit by the alert policy.

    Prints one line of JSON (status, objects, findings, report); exit 0 ok or skipped (an
    earlier run still holds the lock), 1 findings matched fail_on, 2 bad job file,
    unreadable input, nothing to analyze with strict, or a run stuck past its lease.
    """
    import json

    from hybridtrace.job import load_job, run_job
    from hybridtrace.kinds import parse_kinds
    from hybridtrace.store.objects import redact

    try:
        job = load_job(config)
        if fail_on is not None:
            job.fail_on = parse_kinds(fail_on, "--fail-on")
        job.spark = _job_engine(job.spark, engine, spark_master, spark_remote, spark_conf or [])
        code, summary = run_job(job)
    except Exception as exc:  # the scheduler gets its one line whatever went wrong
        if _state["debug"]:
            raise
        message = redact(str(exc) or type(exc).__name__)
        if not isinstance(exc, HybridtraceError):
            message = f"{type(exc).__name__}: {message}"
        typer.echo(json.dumps({"status": "error", "message": message}, separators=(",", ":")))
        typer.echo(f"hybridtrace: error: {message}", err=True)
        raise typer.Exit(2) from None
    typer.echo(json.dumps(summary, separators=(",", ":"), default=str))
    raise typer.Exit(code)


def _job_engine(
    spark: SparkOptions | None, engine: str | None, master: str | None, remote: str | None, conf: list[str]
) -> SparkOptions | None:
    """The job's Spark settings after ``run``'s options: ``--engine`` chooses, the options add
    to (or, for the master and remote, replace) the job's ``[spark]`` table."""
    if engine is None:
        engine = "spark" if spark is not None or master or remote or conf else "local"
    given = _spark_engine(engine, master, remote, conf)
    if given is None:
        return None
    if spark is None:
        return given
    from hybridtrace.spark.session import spark_options

    # a master or remote given here replaces the job's (either one)
    master, remote = (master, remote) if master or remote else (spark.master, spark.remote)
    return spark_options(master, remote, {**spark.conf, **given.conf})


@app.command("explain")
def explain_command(
    request_id: Annotated[str, typer.Argument(help="Decode-side or prefill-side request id.")],
    store: StoreOption = None,
    fmt: FormatOption = OutputFormat.table,
    config: Annotated[str | None, typer.Option(help="hybridtrace.toml with a \\[thresholds] table.")] = None,
    engine: Annotated[
        str | None, typer.Option(help="The decode engine, when several used the same request id.")
    ] = None,
) -> None:
    """One handoff: per-rank timeline, bytes by cache type, tokens, log lines, findings."""
    from hybridtrace.analyze.explain import explain
    from hybridtrace.store import default_store
    from hybridtrace.store.analysis import open_analysis
    from hybridtrace.text.explain import explain_text

    _no_csv(fmt, "explain")
    result = explain(open_analysis(store or default_store(), config=config), request_id, engine_id=engine,
                     config=config)  # fmt: skip
    if fmt is not OutputFormat.table:
        typer.echo(to_json(result))
        return
    typer.echo(explain_text(result))


@app.command("simulate")
def simulate_command(
    out: Annotated[str, typer.Option("--out", help="Folder to write the bundle and truth.json into.")],
    seed: Annotated[int, typer.Option(help="Seed: the same seed writes the same bytes.")] = 0,
    requests: Annotated[
        int | None, typer.Option(help="Exactly this many requests (else rate x duration).")
    ] = None,
    model: Annotated[
        str, typer.Option(help="Built-in model name or a config.json.")
    ] = "nemotron-nano-12b-v2",
    prefill: Annotated[int, typer.Option(help="Prefill engines.")] = 1,
    decode: Annotated[int, typer.Option(help="Decode engines.")] = 1,
    prefill_tp: Annotated[
        str, typer.Option(help="TP of each prefill engine, comma-separated, cycled.")
    ] = "2",
    decode_tp: Annotated[str, typer.Option(help="TP of each decode engine, comma-separated, cycled.")] = "2",
    kv_dtype: Annotated[str, typer.Option(help="KV cache dtype of every engine.")] = "auto",
    ssm_dtype: Annotated[str, typer.Option(help="SSM state dtype.")] = "auto",
    bandwidth: Annotated[str, typer.Option(help="Effective per-read link bandwidth.")] = "20GB/s",
    fixed_cost: Annotated[str, typer.Option(help="Fixed cost per read.")] = "80us",
    duration: Annotated[str, typer.Option(help="Traffic duration.")] = "120s",
    rate: Annotated[float, typer.Option(help="Requests per second.")] = 5.0,
    median_prompt: Annotated[int, typer.Option(help="Median prompt length (lognormal, long tail).")] = 2000,
    cache_hit_rate: Annotated[
        float, typer.Option(help="Share of requests with a cached prefix on the decoder.")
    ] = 0.2,
    era: Annotated[str, typer.Option(help="vLLM expiry wording: abort or lease.")] = "lease",
    colour: Annotated[bool, typer.Option("--colour/--no-colour", help="ANSI colour in the logs.")] = False,
    inject: Annotated[
        str | None, typer.Option(help="KIND\\[=RATE],... or 'all' (rates are shares of requests).")
    ] = None,
    fmt: FormatOption = OutputFormat.table,
) -> None:
    """Write a simulated deployment's telemetry bundle and its ground truth."""
    _keep_freed_pages()
    from hybridtrace.simulate import SimOptions, parse_inject, simulate
    from hybridtrace.text.simulate import simulate_text

    _no_csv(fmt, "simulate")
    options = SimOptions(
        model=model,
        prefill_engines=prefill,
        decode_engines=decode,
        prefill_tp=tuple(parse_int_list(prefill_tp)),
        decode_tp=tuple(parse_int_list(decode_tp)),
        kv_dtype=kv_dtype,
        ssm_dtype=ssm_dtype,
        bandwidth_gb_s=parse_rate(bandwidth) / 1e9,
        fixed_cost_s=parse_duration(fixed_cost),
        duration_s=parse_duration(duration),
        request_rate=rate,
        requests=requests,
        median_prompt_tokens=median_prompt,
        cache_hit_rate=cache_hit_rate,
        era=era,
        colour=colour,
        seed=seed,
        inject=parse_inject(inject),
    )
    options.check()
    truth = simulate(options, out)
    if fmt is OutputFormat.json:
        typer.echo(to_json({"out": out, "inputs": truth["inputs"], "summary": truth["summary"]}))
        return
    typer.echo(simulate_text(out, truth))


@app.command("demo")
def demo_command(
    directory: Annotated[
        str | None,
        typer.Option("--dir", help="Where to put the bundle and the store (default: a new temp dir)."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Simulator seed.")] = 0,
) -> None:
    """Simulate a P/D deployment, ingest it, show what hybridtrace sees, and write the HTML report."""
    from hybridtrace.demo import run_demo
    from hybridtrace.simulate import SimOptions
    from hybridtrace.text.demo import demo_text

    SimOptions(seed=seed).check()  # the demo's deployment with the seed asked
    result = run_demo(directory, seed=seed)
    typer.echo(demo_text(result))


@app.command("verify")
def verify_command(
    pd: Annotated[str, typer.Option("--pd", help="The P/D deployment's URL (its router or proxy).")],
    control: Annotated[
        str, typer.Option("--control", help="A colocated server of the same model (a plain vllm serve).")
    ],
    prompts: Annotated[
        str | None,
        typer.Option(help="JSON Lines: prompt (text) or prompt_token_ids per line, optional id."),
    ] = None,
    lengths: Annotated[
        str | None,
        typer.Option(help="Without --prompts: missing-prefix lengths of the store's traffic "
                          "(default p50,p95,max; pNN, max or a token count)."),
    ] = None,
    max_tokens: Annotated[int, typer.Option(help="Output tokens compared per prompt.")] = 32,
    logprobs: Annotated[int, typer.Option(help="Top logprobs per token (at least 2, to judge ties).")] = 5,
    concurrency: Annotated[int, typer.Option(help="Prompts in flight at once.")] = 4,
    tie_tolerance: Annotated[
        float, typer.Option(help="Nats between the control's top two within which a parting is a near tie.")
    ] = 0.01,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for one answer.")] = 120.0,
    retries: Annotated[int, typer.Option(help="Tries again after 429, 5xx or a dropped connection.")] = 3,
    model: Annotated[
        str | None, typer.Option(help="The served model name (default: the one the P/D serves).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Sampling seed sent to both; also draws built prompts.")] = 0,
    store: StoreOption = None,
    fail_on: Annotated[
        str | None, typer.Option(help="Exit 1 when a prompt is: mismatch, near_tie (comma-separated), any.")
    ] = None,
    progress: Annotated[
        bool | None,
        typer.Option("--progress/--quiet", help="Progress on stderr (default: when stderr is a terminal)."),
    ] = None,
    fmt: FormatOption = OutputFormat.table,
) -> None:
    """Compare greedy outputs of a P/D deployment with a colocated control, prompt by prompt, into the store.

    Exit 0 when every prompt was compared (and none matched --fail-on), 1 when one matched
    --fail-on, 2 on bad usage or when a prompt could not be compared (its row says why).
    """
    from hybridtrace.store import default_store
    from hybridtrace.text.verify import verify_text
    from hybridtrace.verify import VerifyOptions, parse_outcomes, verify

    _no_csv(fmt, "verify")
    outcomes = parse_outcomes(fail_on, "--fail-on") if fail_on is not None else set()
    summary = verify(
        VerifyOptions(
            pd=pd, control=control, store=store or default_store(), prompts=prompts, lengths=lengths,
            max_tokens=max_tokens, logprobs=logprobs, concurrency=concurrency, tie_tolerance=tie_tolerance,
            timeout_s=timeout, retries=retries, model=model, seed=seed,
            progress=sys.stderr.isatty() if progress is None else progress,
        )
    )  # fmt: skip
    if fmt is OutputFormat.json:
        typer.echo(to_json(summary.as_dict()))
    else:
        typer.echo(verify_text(summary))
    errors = summary.errors
    if errors:
        first = errors[0]
        label = first["prompt_id"] or f"#{first['prompt_index']}"
        typer.echo(f"hybridtrace: error: {len(errors)} of {summary.prompts} prompts could not be compared "
                   f"(first, {label}: {first['error']}); their rows in verifications say why",
                   err=True)  # fmt: skip
        raise typer.Exit(2)
    if summary.matched(outcomes):
        raise typer.Exit(1)


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except HybridtraceError as exc:
        if _state["debug"]:
            raise
        typer.echo(f"hybridtrace: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        sys.exit(0)
    except OSError as exc:  # a path the user gave cannot be read or written
        if _state["debug"]:
            raise
        where = f": {exc.filename}" if exc.filename else ""
        typer.echo(f"hybridtrace: error: {exc.strerror or exc}{where}", err=True)
        sys.exit(2)
    except Exception as exc:
        # A store file damaged on disk reaches us as a DuckDB or Arrow error. Exit 1 means
        # "findings matched --fail-on" to a scheduler, so this must be 2, in one line.
        if _state["debug"] or type(exc).__module__.split(".")[0] not in _DATA_ERROR_MODULES:
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        typer.echo(f"hybridtrace: error: cannot read the data: {first}", err=True)
        sys.exit(2)


_DATA_ERROR_MODULES = ("duckdb", "_duckdb", "pyarrow")
