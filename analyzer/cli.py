"""The ``hybridtrace`` command line: options in, a library call, shared output out.

Every command turns its options into arguments of a library function and prints the
result through ``hybridtrace.output``. Errors a user can fix print one line on stderr
and exit 2; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import math
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
from hybridtrace.output import OutputFormat, to_json, to_pairs, to_table

if TYPE_CHECKING:
    from hybridtrace.analyze import Analysis
from hybridtrace.units import (
    format_bytes,
    format_duration,
    format_rate,
    parse_bytes,
    parse_duration,
    parse_int_list,
    parse_rate,
)

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
    from hybridtrace.store import Store

    st = Store(store)
    if not st.exists():
        raise UsageError(f"no hybridtrace store at {store}")
    engines = None
    if pair is not None:
        engines = tuple(p.strip() for p in pair.split(","))
        if len(engines) != 2 or not all(engines):
            raise UsageError("--pair takes PREFILL,DECODE engine ids")
    fit, used = fit_from_store(st.connect(), pair=engines, rank=rank, link=link)
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
        typer.echo(_model_table(result))


StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store", help="Store root (default ./hybridtrace-data or $HYBRIDTRACE_STORE).", show_default=False
    ),
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
) -> None:
    """Read telemetry into the store's Parquet tables; re-runs read only what is new."""
    from hybridtrace.ingest.run import ingest
    from hybridtrace.store import default_store

    _no_csv(fmt, "ingest")
    if year is not None and not 1970 <= year <= 9999:
        raise UsageError(f"--year {year}: give a year between 1970 and 9999")
    summary = ingest(
        paths,
        store or default_store(),
        progress=not quiet and sys.stderr.isatty(),
        year=year,
        tz=tz,
        model=model,
    )
    result = summary.as_dict()
    # what could be read is in the store; what could not is an error the exit code says
    failed = typer.Exit(2) if summary.errors else None
    if fmt is OutputFormat.json:
        typer.echo(to_json(result))
        if failed:
            raise failed
        return
    rows = ", ".join(f"{name} {count:,}" for name, count in sorted(result["rows"].items()) if count) or "none"
    formats = ", ".join(f"{name} {count}" for name, count in sorted(result["by_format"].items())) or "none"
    rate = f"{result['mb_per_s']} MB/s" if result["mb_per_s"] is not None else "-"
    unreadable = f"{summary.errors:,} (see sources where status = 'error')"
    typer.echo(
        to_pairs(
            [
                (
                    "objects",
                    f"{summary.objects_seen} seen, {summary.objects_read} read, "
                    f"{summary.objects_skipped} unchanged"
                    + (f", {summary.objects_gone} gone since the last run" if summary.objects_gone else "")
                    + (f", {summary.objects_left_out} left out (see sources where status = 'skipped')"
                       if summary.objects_left_out else ""),
                ),
                ("formats", formats),
                ("rows", rows),
                ("rejects", f"{summary.rejects:,}"),
                ("duplicates skipped", f"{summary.duplicates:,}"),
                ("time", f"{summary.seconds:.2f} s, {summary.bytes_read / 1e6:.1f} MB read, {rate}"),
            ]
            + ([("unreadable", unreadable)] if summary.errors else [])
        )
    )
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

    from hybridtrace.analyze.thresholds import install as install_thresholds
    from hybridtrace.analyze.thresholds import load as load_thresholds
    from hybridtrace.output import render_rows
    from hybridtrace.store import Store, default_store

    root = store or default_store()
    st = Store(root)
    if not st.exists():
        raise UsageError(f"{root}: no store here (run 'hybridtrace ingest PATH --store {root}' first)")
    con = st.connect()
    # the finding views read their thresholds as analyze does (--config, else ./hybridtrace.toml)
    install_thresholds(con, load_thresholds(config))
    try:
        relation = con.sql(sql)
        if relation is None:
            return
        columns = _unique_names(relation.columns)
        rows = [dict(zip(columns, r, strict=True)) for r in relation.fetchall()]
    except duckdb.Error as exc:
        raise UsageError(f"query failed: {exc}") from exc
    typer.echo(render_rows(rows, fmt, columns))


def _no_csv(fmt: OutputFormat, command: str) -> None:
    """Commands whose output is one nested document print it as a table or as JSON."""
    if fmt is OutputFormat.csv:
        raise UsageError(f"{command} prints a table or json, not csv (try --format json)")


def _check_seed(seed: int) -> None:
    if not 0 <= seed < 2**32:
        raise UsageError(f"--seed {seed}: give a whole number from 0 to {2**32 - 1}")


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
) -> None:
    """Run the finding rules over the store and print the findings."""
    from hybridtrace.analyze import analyze
    from hybridtrace.kinds import parse_kinds
    from hybridtrace.output import to_csv
    from hybridtrace.store import Store, default_store

    root = store or default_store()
    st = Store(root)
    if not st.exists():
        raise UsageError(f"{root}: no store here (run 'hybridtrace ingest PATH --store {root}' first)")
    # an empty --fail-on is refused, as `run` refuses it: a script's empty $KINDS must not
    # turn alerting off without a word
    kinds = parse_kinds(fail_on, "--fail-on") if fail_on is not None else set()
    result = analyze(st.connect(), config=config)
    if fmt is OutputFormat.json:
        typer.echo(to_json(result.as_dict()))
    elif fmt is OutputFormat.csv:
        columns = ["kind", "severity", "engine_id", "rank", "request_id", "remote_engine_id"]
        columns += ["start_ts", "end_ts", "message", "evidence"]
        typer.echo(to_csv(result.findings, columns).rstrip("\n"))
    else:
        typer.echo(_analysis_table(result, limit))
    empty = result.summary["no_inputs"]
    if strict and ("transfers" in empty and "intervals" in empty):
        typer.echo(
            "hybridtrace: error: nothing to analyze: no transfers and no intervals in the store", err=True
        )
        raise typer.Exit(2)
    if kinds and any(result.summary["findings_by_kind"].get(kind) for kind in kinds):
        raise typer.Exit(1)


def _analysis_table(result: Analysis, limit: int) -> str:
    summary, inputs = result.summary, result.inputs
    counts = ", ".join(f"{k} {v}" for k, v in summary["findings_by_kind"].items() if v) or "none"
    pairs = [
        ("inputs", ", ".join(f"{k} {v:,}" for k, v in inputs.items())),
        ("findings", f"{len(result)}: {counts}"),
    ]
    if summary["transported_bytes"] is not None:
        sizes = ", ".join(
            f"{name} {format_bytes(summary[name + '_bytes'])}"
            for name in ("logical", "expected", "reserved", "transported")
        )
        ratio = summary["transported_over_expected"]
        shown = f"{ratio:.4f}" if ratio is not None else "-"
        pairs.append(("bytes (ok reads)", f"{sizes} (transported/expected {shown}, ratio of sums)"))
    for name in summary["no_inputs"]:
        pairs.append(("no input", f"the store has no {name}: the rules that read it matched nothing"))
    if inputs.get("trace_records_dropped"):
        dropped = inputs["trace_records_dropped"]
        pairs.append(("incomplete", f"the trace writers dropped {dropped:,} records: the trace lacks them"))
    if summary["rules_without_inputs"]:
        # a kind can still be found by another rule (the native-metrics ones): say which
        found_by: dict[str, list[str]] = {}
        for rule, counts in summary["rules"].items():
            if counts["findings"]:
                for kind in counts.get("kinds", ()):
                    found_by.setdefault(kind, []).append(rule)
        named = []
        for rule in summary["rules_without_inputs"]:
            others = [r for r in found_by.get(rule, []) if r != rule]
            named.append(f"{rule} (its kind found by {', '.join(others)})" if others else rule)
        pairs.append(("rules with no input", ", ".join(named)))
    rows = [
        {"severity": f["severity"], "kind": f["kind"], "engine": f["engine_id"], "rank": f["rank"],
         "request": f["request_id"] or f["remote_engine_id"], "message": f["message"]}
        for f in result.rows(limit)
    ]  # fmt: skip
    out = to_pairs(pairs)
    if rows:
        out += "\n\n" + to_table(rows, right_align=["rank"])
        if len(result) > limit:
            out += f"\n... {len(result) - limit} more (--limit, or --format json for all)"
    return out


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
) -> None:
    """One self-contained HTML page (charts, findings, engines), or a Markdown summary."""
    from hybridtrace.report import collect, render_markdown, write_report
    from hybridtrace.store import Store, default_store

    if fmt not in ("html", "md"):
        raise UsageError(f"--format: {fmt!r} is not html or md")
    if html and fmt == "md":
        raise UsageError("--html and --format md ask for two different reports: pick one")
    root = store or default_store()
    if not Store(root).exists():
        raise UsageError(f"{root}: no store here (run 'hybridtrace ingest PATH --store {root}' first)")
    if out == "-":
        if fmt != "md":
            raise UsageError("--out - prints the Markdown summary only (add --format md)")
        typer.echo(render_markdown(collect(Store(root).connect(), store=str(root), config=config)), nl=False)
        return
    path, data = write_report(root, out or f"report.{fmt}", fmt=fmt, config=config)
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
) -> None:
    """The scheduled job: ingest what is new, analyze, publish the report, exit by the alert policy.

    Prints one line of JSON (status, objects, findings, report); exit 0 ok or skipped (an
    earlier run still holds the lock), 1 findings matched fail_on, 2 bad job file,
    unreadable input, nothing to analyze with strict, or a run stuck past its lease.
    """
    import json

    from hybridtrace.buckets import redact
    from hybridtrace.job import load_job, run_job
    from hybridtrace.kinds import parse_kinds

    try:
        job = load_job(config)
        if fail_on is not None:
            job.fail_on = parse_kinds(fail_on, "--fail-on")
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
    from hybridtrace.store import Store, default_store

    root = store or default_store()
    st = Store(root)
    if not st.exists():
        raise UsageError(f"{root}: no store here")
    _no_csv(fmt, "explain")
    result = explain(st.connect(), request_id, engine_id=engine, config=config)
    if fmt is not OutputFormat.table:
        typer.echo(to_json(result))
        return
    request = result["request"]
    token_fields = ("prompt_tokens", "cached_tokens", "missing_tokens", "transferred_tokens", "reused_tokens",
                    "recomputed_tokens", "boundary_tokens", "state_blocks")  # fmt: skip
    if request.get("engine_id") is not None:
        pairs = [
            (
                "request",
                f"{request.get('request_id')} on {request.get('engine_id')} (prefill "
                f"{request.get('remote_engine_id') or '?'}: {request.get('remote_request_id') or '?'})",
            ),
            ("status", str(request.get("status"))),
            (
                "tokens",
                ", ".join(f"{k.replace('_tokens', '')} {request[k]}" for k in token_fields if k in request),
            ),
        ]
    else:  # only log lines name it: say so rather than print empty fields
        pairs = [("request", f"{request.get('request_id')} (no request record: only the log lines below)")]
    if result["critical_path_s"] is not None:
        prefill = request.get("prefill_s")
        vs = f" (prefill here: {format_duration(prefill)})" if prefill is not None else ""
        pairs.append(("critical path", f"{format_duration(result['critical_path_s'])}{vs}"))
    typer.echo(to_pairs(pairs))
    reads = [
        {
            "rank": r["rank"],
            "from": f"{r['remote_engine_id']}:{r['remote_rank']}",
            "status": r["status"],
            "post": format_duration(r["post_s"]),
            "xfer": format_duration(r["xfer_s"]),
            "descs": r["descriptors"],
            "transported": r["transported_bytes"],
            "expected": r["expected_bytes"],
            "excess": r["excess_bytes"],
            "GB/s": round(r["effective_gb_s"], 2) if r["effective_gb_s"] else None,
        }
        for r in result["reads"]
    ]
    if reads:
        typer.echo("\nReads\n\n" + to_table(reads))
    types = result["bytes_by_cache_type"]
    if types and types.get("logical_attention") is not None:
        rows = [
            {
                "cache": name,
                **{k: types[f"{k}_{name}"] for k in ("logical", "expected", "reserved", "transported")},
            }
            for name in ("attention", "state")
        ]
        typer.echo("\nBytes by cache type (successful reads)\n\n" + to_table(rows))
    if result["log_events"]:
        typer.echo("\nLog lines\n\n" + to_table(
            [{k: e[k] for k in ("engine_id", "level", "kind", "message")} for e in result["log_events"]]
        ))  # fmt: skip
    findings = [
        {"kind": f["kind"], "severity": f["severity"], "message": f["message"]} for f in result["findings"]
    ]
    typer.echo("\nFindings\n\n" + (to_table(findings) if findings else "none"))


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

    if era not in ("abort", "lease"):
        raise UsageError("--era must be abort or lease")
    if requests is not None and requests < 1:
        raise UsageError("--requests must be at least 1")
    if not (math.isfinite(rate) and rate > 0):
        raise UsageError("--rate must be a positive number of requests per second")
    if median_prompt < 1:
        raise UsageError("--median-prompt must be at least 1 token")
    if not 0 <= cache_hit_rate <= 1:
        raise UsageError("--cache-hit-rate must be between 0 and 1")
    _check_seed(seed)
    _no_csv(fmt, "simulate")
    if parse_duration(duration) <= 0:
        raise UsageError("--duration must be positive")
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
    if prefill < 1 or decode < 1:
        raise UsageError("--prefill and --decode need at least one engine each")
    truth = simulate(options, out)
    if fmt is OutputFormat.json:
        typer.echo(to_json({"out": out, "inputs": truth["inputs"], "summary": truth["summary"]}))
        return
    counts = truth["inputs"]
    injected = ", ".join(f"{k} {v}" for k, v in sorted(truth["summary"]["injected"].items())) or "none"
    natural = ", ".join(f"{k} {v}" for k, v in sorted(truth["summary"]["natural"].items())) or "none"
    typer.echo(
        to_pairs(
            [
                ("bundle", out),
                (
                    "records",
                    f"{counts['requests']:,} requests, {counts['transfers']:,} reads, "
                    f"{counts['engines']} engines",
                ),
                (
                    "native",
                    f"{counts['log_intervals']} KV Transfer metrics lines, {counts['prom_scrapes']} scrapes",
                ),
                ("injected", injected),
                ("also true", natural),
                ("truth", f"{out}/truth.json"),
                ("time", f"{truth['seconds']:.2f} s"),
            ]
        )
    )


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

    _check_seed(seed)
    result = run_demo(directory, seed=seed)
    counts = result.truth["inputs"]
    typer.echo(
        f"Simulated {counts['requests']:,} requests ({counts['transfers']:,} NIXL reads) of a disaggregated "
        f"Nemotron Nano 12B v2 deployment; ingested {result.ingest.objects_read} files."
    )
    for title, rows in result.sections:
        typer.echo(f"\n{title}\n")
        typer.echo(to_table(rows) if rows else "(no rows)")
    injected = ", ".join(f"{k} {v}" for k, v in sorted(result.truth["summary"]["injected"].items()))
    typer.echo(
        "\n"
        + to_pairs(
            [
                ("injected on purpose", injected or "none"),
                ("bundle", str(result.bundle)),
                ("truth", str(result.bundle / "truth.json")),
                ("store", str(result.store)),
                ("findings", f"hybridtrace analyze --store {result.store}"),
                (
                    "explore",
                    f'hybridtrace query "SELECT * FROM request_bytes LIMIT 10" --store {result.store}',
                ),
                ("time", f"{result.seconds:.1f} s"),
                ("report", f"{result.report}  (open it in a browser; no network needed)"),
            ]
        )
    )


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
        counts = ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in summary.by_status.items())
        pairs = [
            ("model", f"{summary.model} (P/D {summary.pd_url}, control {summary.control_url})"),
            ("prompts", f"{summary.prompts}: {counts}"),
            ("store", f"{summary.store}: table verifications, run {summary.run_id}"),
            ("time", f"{summary.seconds:.2f} s"),
        ]
        pairs += [("note", note) for note in summary.notes]
        typer.echo(to_pairs(pairs))
        parted = [
            {"prompt": r["prompt_id"] or f"#{r['prompt_index']}", "status": r["status"],
             "token": r.get("first_divergence"), "of": r.get("tokens_compared"),
             "control gap": round(r["control_top_gap"], 4) if r.get("control_top_gap") is not None else None,
             "P/D id": r.get("pd_response_id")}
            for r in summary.results if r["status"] in ("mismatch", "near_tie")
        ]  # fmt: skip
        if parted:
            typer.echo("\nWhere the outputs part\n\n" + to_table(parted, right_align=["token", "of"]))
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


def _model_table(m: dict) -> str:
    pairs: list[tuple[str, str]] = []
    if m["source"] == "raw":
        pairs.append(("model", "raw figures (no config)"))
    else:
        pairs.append(("model", f"{m['model']} ({m['architecture']})"))
    pairs.append(("tensor parallel", f"TP {m['tp_size']}; every figure is per rank"))
    if m["source"] == "config":
        dt = []
        if m["kv_cache_dtype"]:
            dt.append(f"kv {m['kv_cache_dtype']}")
        if m["mamba_cache_dtype"]:
            dt.append(f"conv {m['mamba_cache_dtype']}, ssm {m['mamba_ssm_cache_dtype']}")
        pairs.append(("dtypes", ", ".join(dt)))
        kind = f" ({m['recurrent_kind']})" if m["recurrent_kind"] else ""
        pairs.append(
            ("layers", f"{m['attention_layers']} attention, {m['recurrent_layers']} recurrent{kind}")
        )
    b = m["attention_bytes_per_token"]
    b_line = f"{b:,} B/token ({format_bytes(b)})"
    if m.get("attention_bytes_per_token_per_layer"):
        b_line += (
            f" = {m['attention_layers']} layers x {m['attention_bytes_per_token_per_layer']:,} B"
            f" ({m['kv_heads_per_rank']} KV heads x head {m['head_size']})"
        )
    pairs.append(("B attention", b_line))
    s = m["state_bytes"]
    s_line = f"{s:,} B ({format_bytes(s)})"
    if m.get("conv_bytes") is not None and m.get("recurrent_layers"):
        s_line += f" = conv {m['conv_bytes']:,} + ssm {m['ssm_bytes']:,}"
        s_line += f"; per layer {m['mamba_page_bytes']:,} B ({format_bytes(m['mamba_page_bytes'])})"
    pairs.append(("S state/snapshot", s_line))
    if m["block_tokens"]:
        blk = f"{m['block_tokens']} tokens"
        if m.get("attention_page_bytes"):
            blk += f"; attention page {m['attention_page_bytes']:,} B per layer"
        pairs.append(("block", blk))
    if m["mamba_padding_pct"] is not None:
        pairs.append(
            (
                "mamba padding",
                f"{m['mamba_padding_pct']:.2f}% (page {m['mamba_page_bytes']:,} B padded to "
                f"{m['mamba_padded_page_bytes']:,} B)",
            )
        )
    groups = m.get("kv_cache_groups")
    if groups:
        pairs.append(
            (
                "kv-cache groups",
                f"{groups['group_size']} layers each: {groups['attention_groups']} attention, "
                f"{groups['recurrent_groups']} recurrent, {groups['padding_layers']} padding layers",
            )
        )
    cross = m["crossover_tokens"]
    pairs.append(
        (
            "crossover",
            f"{cross:,.2f} tokens (S·J/B, J={m['state_blocks']})"
            if cross is not None
            else "none (B or S is 0)",
        )
    )
    pairs.append(
        (
            "link model",
            f"{format_rate(m['bandwidth_bytes_per_s'])} effective + {format_duration(m['fixed_cost_s'])}",
        )
    )
    for note in m["notes"]:
        pairs.append(("note", note))
    rows = [
        {
            "missing": r["missing_tokens"],
            "J": r["state_blocks"],
            "attention B·T": format_bytes(r["attention_payload_bytes"]),
            "state S·J": format_bytes(r["state_payload_bytes"]),
            "logical": format_bytes(r["logical_bytes"]),
            "logical bytes": r["logical_bytes"],
            "expected": format_bytes(r["expected_bytes"]),
            "reserved": format_bytes(r["reserved_bytes"]),
            "link time": format_duration(r["link_seconds"]),
        }
        for r in m["worksheet"]
    ]
    if m["block_tokens"] is None:
        for r in rows:
            del r["expected"], r["reserved"]
    return to_pairs(pairs) + "\n\n" + to_table(rows, right_align=list(rows[0]) if rows else [])


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
