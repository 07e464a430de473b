"""The report's charts, built with Altair from the rows ``data.collect`` gathered.

Charts only draw: every number on them comes from a view. Each builder returns None when
it has nothing to draw, so the page says "no data" instead of showing an empty frame.
Specs skip Altair's schema validation (a second per page); the browser test draws them all.
"""

from __future__ import annotations

from dataclasses import dataclass

import altair as alt

from hybridtrace.report.data import ReportData

WIDTH = 820
MEASURES = ["logical", "expected", "reserved", "transported"]
CACHE_COLOURS = {
    "attention": "#4c78a8",
    "state": "#f58518",
    "other": "#b279a2",
    "unattributed": "#9d9d9d",
}


@dataclass
class Chart:
    """One chart of the page: an anchor, a title, what it shows and its Vega-Lite spec."""

    key: str
    title: str
    caption: str
    spec: dict


class _Datasets:
    """Rows kept beside the spec (its top-level ``datasets``) and named in the charts.

    Altair walks inline ``values`` row by row when it builds a spec, which costs about a
    second per few thousand points; named datasets are copied as they are.
    """

    def __init__(self) -> None:
        self.values: dict[str, list[dict]] = {}

    def __call__(self, rows: list[dict]) -> alt.NamedData:
        name = f"data-{len(self.values)}"
        self.values[name] = rows
        return alt.NamedData(name=name)

    def spec(self, chart: alt.TopLevelMixin) -> dict:
        spec = chart.to_dict(validate=False)
        spec["datasets"] = self.values
        return spec


def _short(request_id: str) -> str:
    return request_id if len(request_id) <= 18 else request_id[:8] + "…" + request_id[-8:]


def bytes_by_cache(data: ReportData) -> Chart | None:
    ds = _Datasets()
    if not data.request_bytes:
        return None
    values = [{**row, "request": _short(row["request_id"])} for row in data.request_bytes]
    order: list[str] = []
    for row in values:  # already sorted by excess, worst first
        if row["request"] not in order:
            order.append(row["request"])
    chart = (
        alt.Chart(ds(values))
        .mark_bar()
        .encode(
            x=alt.X("request:N", sort=order, title="request (worst excess first, then a sample)",
                    axis=alt.Axis(labelAngle=-60, labelLimit=120)),
            xOffset=alt.XOffset("measure:N", sort=MEASURES),
            y=alt.Y("sum(bytes):Q", title="bytes (all ranks)", stack="zero"),
            color=alt.Color("cache:N", title="cache",
                            scale=alt.Scale(domain=list(CACHE_COLOURS), range=list(CACHE_COLOURS.values()))),
            opacity=alt.Opacity("measure:N", sort=MEASURES, legend=alt.Legend(title="count (left to right)"),
                                scale=alt.Scale(domain=MEASURES, range=[0.45, 0.65, 0.8, 1.0])),
            tooltip=["request_id:N", "engine_id:N", "measure:N", "cache:N",
                     alt.Tooltip("sum(bytes):Q", title="bytes", format=",")],
        )
        .properties(width=WIDTH, height=300)
    )  # fmt: skip
    requests = len(order)
    return Chart(
        "bytes-by-cache",
        "Bytes by cache type per request",
        f"{requests} of {data.counts['requests_accounted']:,} requests: logical, expected, reserved and "
        "transported bytes (left to right in each group), split by cache type.",
        ds.spec(chart),
    )


def payload_vs_tokens(data: ReportData) -> Chart | None:
    ds = _Datasets()
    sized = [r for r in data.reads if r["expected_bytes"] is not None]  # the byte model sized them
    if not sized:
        return None
    reads = [{**r, "over expected": "yes" if (r["excess_bytes"] or 0) > 0 else "no"} for r in sized]
    lines = []
    for row in data.model_lines:
        lines.append({"engine_id": row["engine_id"], "tokens": row["tokens"], "bytes": row["logical_bytes"],
                      "line": "logical B·T + S"})  # fmt: skip
        lines.append({"engine_id": row["engine_id"], "tokens": row["tokens"], "bytes": row["expected_bytes"],
                      "line": "expected (whole blocks)"})  # fmt: skip
    crossovers = {r["engine_id"]: r["crossover_tokens"] for r in data.model_lines if r["crossover_tokens"]}
    panels = []
    for engine in sorted({r["engine_id"] for r in reads}):
        points = (
            alt.Chart(ds([r for r in reads if r["engine_id"] == engine]))
            .mark_circle(size=14, opacity=0.6)
            .encode(
                x=alt.X("transferred_tokens:Q", title="transferred tokens T"),
                y=alt.Y("transported_bytes:Q", title="bytes per read (one rank)"),
                color=alt.Color("over expected:N", scale=alt.Scale(domain=["no", "yes"],
                                range=["#4c78a8", "#e45756"])),
                tooltip=["request_id:N", "rank:Q", "transferred_tokens:Q",
                         alt.Tooltip("transported_bytes:Q", format=","),
                         alt.Tooltip("expected_bytes:Q", format=",")],
            )
        )  # fmt: skip
        layers = [points]
        engine_lines = [line for line in lines if line["engine_id"] == engine]
        if engine_lines:
            layers.append(
                alt.Chart(ds(engine_lines))
                .mark_line(color="#222")
                .encode(x="tokens:Q", y="bytes:Q", strokeDash=alt.StrokeDash("line:N", title="byte model"))
            )
        if engine in crossovers:
            layers.append(
                alt.Chart(ds([{"crossover": crossovers[engine], "label": "S/B crossover"}]))
                .mark_rule(color="#54a24b", strokeWidth=2)
                .encode(x="crossover:Q",
                        tooltip=[alt.Tooltip("crossover:Q", format=",.0f", title="S/B tokens")])
            )
        panels.append(alt.layer(*layers).properties(width=WIDTH, height=260, title=f"decode engine {engine}"))
    return Chart(
        "payload",
        "Payload against tokens",
        f"{len(reads):,} of {data.counts['reads_ok']:,} successful reads (a hash sample) against the byte "
        "model's line per read; the green rule is the crossover S/B, below which the state outweighs "
        "the attention KV.",
        ds.spec(alt.vconcat(*panels)),
    )


def ranks(data: ReportData) -> Chart | None:
    ds = _Datasets()
    if not data.ranks:
        return None
    values = [{**r, "rank_label": f"{r['engine_id']} · rank {r['rank']}",
               "state": "slow rank" if r["slow"] else "peer"} for r in data.ranks]  # fmt: skip
    colour = alt.Color("state:N", title="", scale=alt.Scale(domain=["peer", "slow rank"],
                                                            range=["#4c78a8", "#e45756"]))  # fmt: skip
    bandwidth = (
        alt.Chart(ds(values))
        .mark_bar()
        .encode(
            y=alt.Y("rank_label:N", title=None, sort=None),
            x=alt.X("effective_gb_s:Q", title="effective bandwidth, GB/s (bytes / transfer time)"),
            color=colour,
            tooltip=["engine_id:N", "rank:Q", "reads:Q", alt.Tooltip("effective_gb_s:Q", format=".2f")],
        )
        .properties(width=WIDTH // 2 - 60, height=max(60, 22 * len(values)))
    )
    completion = alt.Chart(ds(values)).encode(y=alt.Y("rank_label:N", title=None, sort=None))
    spread = completion.mark_rule(color="#888").encode(
        x=alt.X("p50_xfer_ms:Q", title="completion time per read, ms (p50 bar, p90 and max)"),
        x2="max_xfer_ms:Q",
    )
    median = completion.mark_tick(thickness=3, size=16).encode(x="p50_xfer_ms:Q", color=colour)
    p90 = completion.mark_tick(thickness=1, size=12, color="#222").encode(
        x="p90_xfer_ms:Q",
        tooltip=["engine_id:N", "rank:Q", alt.Tooltip("p50_xfer_ms:Q", format=".2f"),
                 alt.Tooltip("p90_xfer_ms:Q", format=".2f"), alt.Tooltip("max_xfer_ms:Q", format=".2f")],
    )  # fmt: skip
    height = max(60, 22 * len(values))
    times = alt.layer(spread, median, p90).properties(width=WIDTH // 2 - 60, height=height)
    chart = alt.hconcat(bandwidth, times)
    slow = sum(1 for r in data.ranks if r["slow"])
    return Chart(
        "ranks",
        "Per-rank bandwidth and completion time",
        f"{len(values)} decode rank{'s' if len(values) != 1 else ''} over "
        f"{sum(r['reads'] for r in data.ranks):,} successful reads; {slow} flagged slow (red). Bandwidth "
        "here is all of a rank's bytes over all its transfer time, so a few long reads pull it down; "
        "slow_rank compares medians per time window against the rank's peers, so its figures differ.",
        ds.spec(chart),
    )


def descriptors(data: ReportData) -> Chart | None:
    ds = _Datasets()
    reads = [r for r in data.reads if r["descriptors"] is not None and r["post_ms"] is not None]
    if not reads:
        return None
    share = data.thresholds.get("descriptor_post_share", 0.5)
    values = [{**r, "posting": "post-bound read" if (r["post_share"] or 0) >= share else "read"}
              for r in reads]  # fmt: skip
    chart = (
        alt.Chart(ds(values))
        .mark_circle(size=14, opacity=0.6)
        .encode(
            x=alt.X("descriptors:Q", title="descriptors per read", scale=alt.Scale(type="symlog")),
            y=alt.Y("post_ms:Q", title="post time, ms"),
            color=alt.Color("posting:N", title=f"post ≥ {share:g} of transfer time",
                            scale=alt.Scale(domain=["read", "post-bound read"],
                                            range=["#4c78a8", "#e45756"])),
            tooltip=["request_id:N", "rank:Q", "descriptors:Q", alt.Tooltip("post_ms:Q", format=".3f"),
                     alt.Tooltip("xfer_ms:Q", format=".3f"), alt.Tooltip("post_share:Q", format=".2f")],
        )
        .properties(width=WIDTH, height=260)
    )  # fmt: skip
    return Chart(
        "descriptors",
        "Descriptor count against post time",
        f"{len(values):,} of {data.counts['reads_ok']:,} successful reads (the same sample as above).",
        ds.spec(chart),
    )


def recompute(data: ReportData) -> Chart | None:
    ds = _Datasets()
    values = [r for r in data.recompute if r["seconds"] is not None]
    if not values:
        return None
    values = [{**r, "ms": r["seconds"] * 1e3} for r in values]
    buckets = []
    for row in sorted(values, key=lambda r: r["bucket_order"]):
        if row["bucket"] not in buckets:
            buckets.append(row["bucket"])
    chart = (
        alt.Chart(ds(values))
        .mark_line(point=True)
        .encode(
            x=alt.X("bucket:O", sort=buckets, title="missing prefix (tokens)"),
            y=alt.Y("ms:Q", title="milliseconds", scale=alt.Scale(type="log")),
            color=alt.Color("side:N", title="", scale=alt.Scale(domain=["transfer (X)", "recompute (R)"],
                                                                range=["#e45756", "#54a24b"])),
            strokeDash=alt.StrokeDash("statistic:N", sort=["p50", "p95", "max"]),
            detail="engine_id:N",
            tooltip=["engine_id:N", "bucket:N", "requests:Q", "statistic:N", "side:N",
                     alt.Tooltip("ms:Q", format=".2f"), "prefill_source:N"],
        )
        .properties(width=WIDTH, height=260)
    )  # fmt: skip
    if len({r["engine_id"] for r in values}) > 1:  # one panel per decode engine, not lines on lines
        chart = chart.properties(height=200).facet(row=alt.Row("engine_id:N", title="decode engine"))
    sources = sorted({r["prefill_source"] for r in values if r["prefill_source"]})
    return Chart(
        "recompute",
        "Transfer against recompute",
        f"{data.counts['handoffs_compared']:,} handoffs with both X (critical path) and R (prefill: "
        f"{', '.join(sources) or 'unknown'}) at p50, p95 and max per missing-prefix bucket.",
        ds.spec(chart),
    )


def intervals(data: ReportData) -> Chart | None:
    ds = _Datasets()
    if not data.intervals:
        return None
    values = [{**r, "time": r["end_ts"] * 1000, "series": f"{r['engine_id']} ({r['source_kind']})"}
              for r in data.intervals]  # fmt: skip
    base = alt.Chart(ds(values)).encode(
        x=alt.X("time:T", title=None), color=alt.Color("series:N", title="engine (source)")
    )
    fields = (
        ("throughput_mib_s", "MiB/s"),
        ("mib_per_transfer", "MiB per transfer"),
        ("failed_transfers", "failed"),
        ("expired_requests", "expired"),
    )
    panels = [
        base.mark_line(point=True).encode(y=alt.Y(field, type="quantitative", title=title),
                                          tooltip=["series:N", "time:T", f"{field}:Q"])
        .properties(width=WIDTH, height=110)
        for field, title in fields
        if any(r[field] is not None for r in values)
    ]  # fmt: skip
    if not panels:
        return None
    missing = [title for field, title in fields if all(r[field] is None for r in values)]
    left_out = f" Not drawn, as no interval reports them: {', '.join(missing)}." if missing else ""
    return Chart(
        "intervals",
        "Native metrics over time",
        f"{data.counts['intervals']:,} intervals from `KV Transfer metrics` lines and Prometheus scrapes, "
        f"in {len(values):,} points (merged into time bins when there are more than 400 per series)."
        f"{left_out}",
        ds.spec(alt.vconcat(*panels).resolve_scale(color="shared")),
    )


def link_fit(data: ReportData) -> Chart | None:
    ds = _Datasets()
    if not data.link_fit_lines:
        return None
    fits = sorted({r["fit"] for r in data.link_fit_lines})
    colour = alt.Color("fit:N", title="decode rank (← prefill · route)", sort=fits,
                       legend=alt.Legend(labelLimit=360))
    points = (
        alt.Chart(ds(data.link_fit_points))
        .mark_circle(size=14, opacity=0.5)
        .encode(
            x=alt.X("bytes:Q", title="bytes per read"),
            y=alt.Y("xfer_ms:Q", title="transfer time, ms"),
            color=colour,
            tooltip=["fit:N", alt.Tooltip("bytes:Q", format=","), alt.Tooltip("xfer_ms:Q", format=".3f"),
                     "descriptors:Q"],
        )
    )  # fmt: skip
    lines = (
        alt.Chart(ds(data.link_fit_lines))
        .mark_line(strokeWidth=2)
        .encode(
            x="bytes:Q", y="xfer_ms:Q", color=colour,
            tooltip=["fit:N", alt.Tooltip("fixed_s:Q", format=".2e", title="fixed, s"),
                     alt.Tooltip("bandwidth_gb_s:Q", format=".2f", title="bandwidth, GB/s"),
                     alt.Tooltip("per_descriptor_s:Q", format=".2e", title="per descriptor, s"),
                     "transfers_used:Q",
                     alt.Tooltip("median_error_pct:Q", format=".1f", title="median error %")],
        )
    )  # fmt: skip
    chart = alt.layer(points, lines).properties(width=WIDTH, height=300)
    return Chart(
        "link-fit",
        "The link fitted per rank",
        f"{len(fits)} rank fit{'s' if len(fits) != 1 else ''} over {data.counts['link_fit_reads']:,} reads; "
        f"{len(data.link_fit_points):,} of them drawn (up to 300 per rank, by hash). Each line is its fit: "
        "fixed cost + bytes / bandwidth + descriptors × per-descriptor cost, descriptors at the reads' bytes "
        "per descriptor; reads with more or fewer descriptors for their bytes sit above or below it.",
        ds.spec(chart),
    )


BUILDERS = (bytes_by_cache, payload_vs_tokens, ranks, link_fit, descriptors, recompute, intervals)
# what the page calls each chart, for the line that names those with nothing to draw
TITLES = {
    "bytes_by_cache": "Bytes by cache type per request",
    "payload_vs_tokens": "Payload against tokens",
    "ranks": "Per-rank bandwidth and completion time",
    "link_fit": "The link fitted per rank",
    "descriptors": "Descriptor count against post time",
    "recompute": "Transfer against recompute",
    "intervals": "Native metrics over time",
}


def build_charts(data: ReportData) -> tuple[list[Chart], list[str]]:
    """The charts with data, and the titles of those without (said on the page)."""
    charts, empty = [], []
    for builder in BUILDERS:
        chart = builder(data)
        if chart is None:
            empty.append(TITLES.get(builder.__name__, builder.__name__.replace("_", " ")))
        else:
            charts.append(chart)
    return charts, empty
