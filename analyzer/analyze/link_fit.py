"""The link model fitted from what the transfers did: time = fixed + bytes / bandwidth +
descriptors × per-descriptor cost.

The seed's model has two typed-in numbers; the store holds thousands of reads that measure
them. The fit is a median (L1) regression, solved by iteratively reweighted least squares:
a slow tail (a congested read, a poll that came late) pulls a least-squares line up, a
median line not at all, as long as the slow reads are fewer than half. Bytes and
descriptors are scaled before solving, so the 3×3 system stays well conditioned across
nine orders of magnitude. When descriptors only ever grow with bytes (a fixed block size)
the two costs cannot be told apart: the fit then leaves the descriptor term out and says so.

``fit_link`` fits one set of reads (``model --link-from`` through ``fit_from_store``);
``link_fits_frame`` fits every group the analysis uses — per decode rank of an engine pair
and route, per pair, per named route and fleet-wide — and ``refresh_link_fits`` keeps them
in the table behind the ``link_fits`` view (``queries/link_fit.sql``), filled when the
store is opened for analysis (``store/analysis.py``): fitted once per state of the data, and
read back by later connections on the same files (``stored_link_fits``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl
    import pyarrow as pa


class _Polars:
    """polars, imported when a fit is first computed: opening a store reads the fits kept
    for its files (``stored_link_fits``), and importing polars took a third of the open."""

    def __getattr__(self, name: str):
        import polars

        globals()["pl"] = polars
        return getattr(polars, name)


if not TYPE_CHECKING:
    pl = _Polars()

ITERATIONS = 50
MIN_TRANSFERS = 8
# The fits table fits at most this many reads of a group (a seeded sample): a median line
# through 20,000 reads is as sure as through millions, and opening a large store stays quick.
MAX_FIT_READS = 20_000


@dataclass(frozen=True)
class LinkFit:
    transfers: int  # reads the fit used
    fixed_s: float
    bandwidth_bytes_per_s: float | None  # None when bytes did not explain time (flat or negative)
    per_descriptor_s: float | None  # None when descriptors could not be told apart from bytes
    median_abs_error_pct: float  # over the reads used: how well the line describes them
    note: str = ""

    def seconds(self, nbytes: float, descriptors: float = 0.0) -> float:
        """The fitted time of one read."""
        time = self.fixed_s
        if self.bandwidth_bytes_per_s:
            time += nbytes / self.bandwidth_bytes_per_s
        if self.per_descriptor_s:
            time += descriptors * self.per_descriptor_s
        return time

    def as_dict(self) -> dict:
        return asdict(self)


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None for a singular system."""
    n = len(vector)
    rows = [[*matrix[i], vector[i]] for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(rows[r][col]))
        if abs(rows[pivot][col]) < 1e-12:
            return None
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(n):
            if r != col:
                factor = rows[r][col] / rows[col][col]
                rows[r] = [a - factor * b for a, b in zip(rows[r], rows[col], strict=True)]
    return [rows[i][n] / rows[i][i] for i in range(n)]


@dataclass(frozen=True)
class _Prepared:
    """One set of reads made ready for the IRLS: scaled regressors and the bookkeeping to undo it."""

    work: pl.DataFrame  # columns ``one``, ``x0`` [, ``x1``] (scaled) and ``y`` (seconds)
    names: list[str]  # the regressors' columns in ``work``
    x_names: list[str]  # the source columns of x0 [, x1]
    scales: dict[str, float]
    floor: float  # the least residual a weight divides by
    note: str


def _prepare(frame: pl.DataFrame, time: str, nbytes: str, descriptors: str | None) -> _Prepared | None:
    """The usable reads of ``frame``, scaled; None when fewer than ``MIN_TRANSFERS`` remain."""
    columns = [time, nbytes] + ([descriptors] if descriptors and descriptors in frame.columns else [])
    data = frame.select([pl.col(c).cast(pl.Float64) for c in columns]).drop_nulls()
    data = data.filter(pl.all_horizontal(pl.all().is_finite()) & (pl.col(time) > 0))
    if data.height < MIN_TRANSFERS:
        return None
    x_names = columns[1:]
    scales = {c: (data[c].mean() or 1.0) or 1.0 for c in x_names}
    note = ""
    if len(x_names) == 2:
        corr = data.select(pl.corr(x_names[0], x_names[1])).item()
        spread = data[x_names[1]].std() or 0.0
        if spread == 0 or (corr is not None and abs(corr) > 0.999):
            x_names = x_names[:1]
            note = "descriptors grow with bytes here: their cost is in the bandwidth figure"
    names = ["one", *(f"x{i}" for i in range(len(x_names)))]
    work = data.select(
        pl.lit(1.0).alias("one"),
        *(pl.col(c) / scales[c] for c in x_names),
        pl.col(time).alias("y"),
    ).rename(dict(zip(x_names, names[1:], strict=True)))
    floor = 1e-6 * work["y"].abs().mean()
    return _Prepared(work, names, x_names, scales, floor, note)


def _fitted(names: list[str], coef: list[float]) -> pl.Expr:
    return pl.sum_horizontal([pl.col(n) * c for n, c in zip(names, coef, strict=True)])


def _normal_sums(fit: _Prepared, coef: list[float] | None,
                 built: dict[int, tuple]) -> tuple[pl.LazyFrame, dict[tuple[str, str], str]]:  # fmt: skip
    """One iteration's weighted sums of products (a plan of one row), and the sum each entry
    of the normal equations (a, b) — b ``y`` for the right-hand side — reads.

    The weights are a column computed once, not once per sum, and each weighted regressor
    w·a once for the sums that read it; the products are otherwise the one-sum-per-entry
    form's, (w·a)·b, w·1 included: over reads in one chunk (a group's sorted sample) each sum
    adds the very values in the very order that form added, so the fit is the same to the
    last bit. That matters: on reads where the median line is not unique the IRLS has not
    settled after ``ITERATIONS``, and another summation order (another chunking, the
    streaming engine's morsels) moves the fit by parts in 10⁴. The coefficients enter as
    columns of one value, so that a set's expressions are built once (in ``built``) and not
    again each iteration: the same products of the same floats.
    """
    entries = {(a, b): f"{a}*{b}" for a in fit.names for b in [*fit.names, "y"]}
    if max(fit.work.n_chunks("all")) > 1:
        # reads in several chunks (a whole store's, from Arrow): how polars splits the shared
        # weights among them is its own, so these sums are the one-select form's, as they were
        if coef is None:
            weights = pl.lit(1.0)
        else:
            residual = (pl.col("y") - _fitted(fit.names, coef)).abs()
            weights = 1.0 / pl.max_horizontal(residual, pl.lit(fit.floor))
        inline = (pl.sum_horizontal(weights * pl.col(a) * pl.col(b)).sum().alias(key)
                  for (a, b), key in entries.items())  # fmt: skip
        return fit.work.lazy().select(inline), entries
    if id(fit) not in built:
        terms = [pl.col(n) * pl.col(f"_c{i}") for i, n in enumerate(fit.names)]
        residual = (pl.col("y") - pl.sum_horizontal(terms)).abs()
        built[id(fit)] = (
            # L1: weights 1/|residual| make least squares converge to the median line
            (1.0 / pl.max_horizontal(residual, pl.lit(fit.floor))).alias("_w"),
            [(pl.col("_w") * pl.col(a)).alias(f"_w{a}") for a in fit.names],
            [(pl.col(f"_w{a}") * pl.col(b)).sum().alias(key) for (a, b), key in entries.items()],
        )
    weights, weighted, sums = built[id(fit)]
    plan = fit.work.lazy()
    if coef is None:
        plan = plan.with_columns(pl.lit(1.0).alias("_w"))  # the first pass is least squares
    else:
        plan = plan.with_columns(pl.lit(c, pl.Float64).alias(f"_c{i}") for i, c in enumerate(coef))
        plan = plan.with_columns(weights)
    return plan.with_columns(weighted).select(sums), entries


def _irls(fits: list[_Prepared]) -> list[list[float] | None]:
    """The median-line coefficients of each prepared set of reads (None: a singular system).

    All sets iterate together: each iteration is one ``collect_all`` of the sums of every set
    still iterating (one call into polars, not one a set: on a sample of 20,000 reads the
    call's overhead is much of its time), and a set leaves the loop at the iteration its own
    convergence test passes, as alone it would.
    """
    coefs: list[list[float] | None] = [None] * len(fits)
    going = list(range(len(fits)))
    built: dict[int, tuple] = {}
    chunked = [max(fit.work.n_chunks("all")) > 1 for fit in fits]
    for _ in range(ITERATIONS):
        if not going:
            break
        plans = [_normal_sums(fits[i], coefs[i], built) for i in going]
        results: list[pl.DataFrame] = [pl.DataFrame()] * len(going)
        # the one-chunk plans are a bare chain of projections: the optimizer would find nothing
        # to gain there, at a cost; the several-chunk ones sum as the eager select did only
        # with its optimizations (the shared weights computed once), so they keep them
        for several, flags in ((False, pl.QueryOptFlags.none()), (True, pl.QueryOptFlags())):
            which = [k for k, i in enumerate(going) if chunked[i] is several]
            if not which:
                continue
            # the in-memory engine, as an eager select runs: the streaming one sums in
            # morsels, another order (and so, here, another fit)
            done = pl.collect_all([plans[k][0] for k in which], engine="in-memory", optimizations=flags)
            for k, result in zip(which, done, strict=True):
                results[k] = result
        still = []
        for i, (_, entries), result in zip(going, plans, results, strict=True):
            sums = result.row(0, named=True)
            names = fits[i].names
            solved = _solve([[sums[entries[a, b]] for b in names] for a in names],
                            [sums[entries[a, "y"]] for a in names])  # fmt: skip
            if solved is None:
                coefs[i] = None
                continue
            coef = coefs[i] or [0.0] * len(names)
            shift = max(abs(a - b) for a, b in zip(solved, coef, strict=True))
            coefs[i] = solved
            if not shift < 1e-12 * max(abs(c) for c in solved):
                still.append(i)
        going = still
    return coefs


def _fit_links(sets: list[tuple[pl.DataFrame, str | None]], *, time: str = "xfer_s",
               nbytes: str = "bytes") -> list[LinkFit | None]:  # fmt: skip
    """``fit_link`` of each (reads, descriptors column) at once: one IRLS loop for all."""
    prepared = [_prepare(frame, time, nbytes, descriptors) for frame, descriptors in sets]
    ready = [p for p in prepared if p is not None]
    coefs = dict(zip(map(id, ready), _irls(ready), strict=True))
    solved = [p for p in ready if coefs[id(p)] is not None]
    errors = pl.collect_all([
        p.work.lazy().select(((_fitted(p.names, coefs[id(p)]) - pl.col("y")).abs() / pl.col("y")).median())
        for p in solved
    ], engine="in-memory")  # fmt: skip
    medians = {id(p): e.item() * 100 for p, e in zip(solved, errors, strict=True)}
    fits: list[LinkFit | None] = []
    for p in prepared:
        coef = coefs.get(id(p)) if p is not None else None
        if p is None or coef is None:
            fits.append(None)
            continue
        per_byte = coef[1] / p.scales[p.x_names[0]]
        per_descriptor = coef[2] / p.scales[p.x_names[1]] if len(p.x_names) == 2 else None
        fits.append(LinkFit(
            transfers=p.work.height,
            fixed_s=coef[0],
            bandwidth_bytes_per_s=1.0 / per_byte if per_byte > 0 and math.isfinite(per_byte) else None,
            per_descriptor_s=per_descriptor if per_descriptor is not None and per_descriptor > 0 else None,
            median_abs_error_pct=round(medians[id(p)], 3),
            note=p.note,
        ))  # fmt: skip
    return fits


def fit_link(frame: pl.DataFrame, *, time: str = "xfer_s", nbytes: str = "bytes",
             descriptors: str | None = "descriptors") -> LinkFit | None:
    """Fit one link from reads (columns ``time`` s, ``nbytes``, optionally ``descriptors``).

    None when fewer than ``MIN_TRANSFERS`` usable reads (finite, positive time) remain.
    """
    return _fit_links([(frame, descriptors)], time=time, nbytes=nbytes)[0]


def fit_from_store(con, *, pair: tuple[str, str] | None = None, rank: int | None = None,
                   link: str | None = None) -> tuple[LinkFit | None, str]:
    """The link fitted from a store's successful reads, and where they came from.

    The connector trace's reads (with descriptors) when the store has them, else NIXL's
    own ring transfers (no descriptors, no pair). ``pair`` is (prefill, decode) engine
    ids, ``rank`` the decode TP rank, ``link`` the trace's route; all narrow the reads.
    """
    where, params = ["status = 'ok'", "xfer_s > 0"], []
    if pair is not None:
        where.append("remote_engine_id = ? AND engine_id = ?")
        params += list(pair)
    if rank is not None:
        where.append("rank = ?")
        params.append(rank)
    if link is not None:
        where.append("link = ?")
        params.append(link)
    query = ("SELECT xfer_s, transported_bytes AS bytes, descriptors FROM transfers WHERE "
             + " AND ".join(where))
    frame = pl.from_arrow(con.sql(query, params=params).to_arrow_table())
    if frame.height or pair is not None or rank is not None or link is not None:
        return fit_link(frame), f"{frame.height} trace reads"
    frame = pl.from_arrow(con.sql(
        "SELECT xfer_us / 1e6 AS xfer_s, transported_bytes AS bytes FROM nixl_transfers WHERE xfer_us > 0"
    ).to_arrow_table())
    return fit_link(frame, descriptors=None), f"{frame.height} NIXL ring transfers"


def _fit_types() -> dict:
    # a function, not a constant: the types are polars', imported when first fitted
    return {
        "scope": pl.String, "engine_id": pl.String, "remote_engine_id": pl.String, "rank": pl.Int32,
        "link": pl.String, "source": pl.String, "reads": pl.Int64, "transfers_used": pl.Int64,
        "fixed_s": pl.Float64, "bandwidth_bytes_per_s": pl.Float64, "per_descriptor_s": pl.Float64,
        "bytes_per_descriptor": pl.Float64,
        "median_error_pct": pl.Float64, "note": pl.String,
    }  # fmt: skip
_GROUPS = {  # the keys each scope groups the reads by (those left out are null in its rows)
    "rank": ("engine_id", "remote_engine_id", "rank", "link"),
    "pair": ("engine_id", "remote_engine_id"),
    "link": ("link",),
    "fleet": (),
}


# A read's identity for the sample: its values (two reads alike in all of them are
# interchangeable), so that the same reads give the same sample in any scan order.
_TRACE_READS = """
SELECT engine_id, remote_engine_id, rank, link, xfer_s, transported_bytes AS bytes, descriptors,
       hash(engine_id, remote_engine_id, rank, link, xfer_s, transported_bytes, descriptors) AS h
FROM transfers WHERE status = 'ok' AND xfer_s > 0
"""
# a ring names neither the peer nor the route: an agent's fits are its engine's and rank's
_RING_READS = """
SELECT engine_id, CAST(NULL AS VARCHAR) AS remote_engine_id, rank, CAST(NULL AS VARCHAR) AS link,
       xfer_us / 1e6 AS xfer_s, transported_bytes AS bytes, CAST(NULL AS BIGINT) AS descriptors,
       hash(engine_id, rank, xfer_us, transported_bytes) AS h
FROM nixl_transfer_ranks WHERE xfer_us > 0
"""
# Reads kept per group before the exact cut to MAX_FIT_READS: the hash is uniform, so a group
# of n reads keeps about OVERSAMPLE × MAX_FIT_READS of them below its threshold.
_OVERSAMPLE = 3
_HASH_SPACE = 1 << 64
# Reads below the highest threshold may be this many times those below each one's own before
# the scan joins the reads with the thresholds to keep only the latter.
_ALIKE = 1.25


def _in_scope(scope: str) -> pl.Expr:
    """The reads a scope's groups are made of (those left out have no such group)."""
    if scope == "link":
        return pl.col("link").is_not_null()
    if scope == "pair":
        return pl.col("engine_id").is_not_null()  # an unmapped ring agent has no pair
    if scope == "rank":
        return pl.col("engine_id").is_not_null() & pl.col("rank").is_not_null()
    return pl.lit(True)


def _hash_below(share: pl.Expr) -> pl.Expr:
    """The hash a read must fall below to be kept, for a group keeping ``share`` of its reads
    (null: keep every read)."""
    share = share.clip(upper_bound=1.0)
    below = (share * _HASH_SPACE).cast(pl.UInt64)
    return pl.when(share >= 1.0).then(pl.lit(None, pl.UInt64)).otherwise(below)


def _sampled_reads(con, reads_sql: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(the group sizes of the finest grouping, the reads each group's sample can draw from).

    A group's sample is its ``MAX_FIT_READS`` reads of lowest hash. Every read of a group
    below the group's threshold is kept (its coarsest group's threshold is the lowest), so
    the reads kept hold each group's sample whenever enough of them fall below it; the
    caller checks that, group by group, after cutting each group at its own threshold (some
    reads above it may be kept: where the thresholds are alike, all below the highest).
    Nothing of the millions of reads is sorted.
    """
    keys = list(_GROUPS["rank"])
    # two scans of the store's reads rather than one copy of them read twice: DuckDB reads
    # the few columns each scan needs straight from Parquet faster than from a temporary table
    finest = pl.from_arrow(
        con.sql(f"SELECT {', '.join(keys)}, count(*) AS n FROM ({reads_sql}) GROUP BY ALL").to_arrow_table()
    )
    if finest.height == 0:
        return finest, pl.DataFrame()
    # each finest group: the highest threshold of the groups it belongs to
    limit = pl.lit(float(_OVERSAMPLE * MAX_FIT_READS))
    thresholds = []
    for scope, group_keys in _GROUPS.items():
        sizes = finest.filter(_in_scope(scope))
        size = pl.col("n").sum().over(list(group_keys)) if group_keys else pl.col("n").sum()
        thresholds.append(sizes.select(*keys, "n", (limit / size).clip(upper_bound=1.0).alias("share")))
    shares = pl.concat(thresholds).group_by(keys).agg(pl.col("share").max(), pl.col("n").first())
    cut = shares.select(*keys, _hash_below(pl.col("share")).alias("below"))
    # no read at or above every group's threshold is kept: cut those in the scan
    below_all = None if cut["below"].null_count() else cut["below"].max()
    if below_all is not None and (
        shares["n"].sum() * shares["share"].max() <= _ALIKE * (shares["n"] * shares["share"]).sum()
    ):
        # the thresholds alike (the groups of a scope are of a size): the reads below the highest
        # are few more than those below each one's own, and no join of the reads with the
        # thresholds is worth its cost; the caller cuts each group at its own threshold anyway
        plain = con.sql(f"SELECT * FROM ({reads_sql}) WHERE h < ?", params=[below_all])
        return finest, pl.from_arrow(plain.to_arrow_table())
    con.register("_fit_cut", cut.to_arrow())
    try:
        kept = pl.from_arrow(con.sql(
            f"SELECT r.* FROM ({reads_sql}) r JOIN _fit_cut c ON "
            + " AND ".join(f"r.{k} IS NOT DISTINCT FROM c.{k}" for k in keys)
            + " WHERE (c.below IS NULL OR r.h < c.below)"
            + ("" if below_all is None else " AND r.h < ?"),
            params=[] if below_all is None else [below_all],
        ).to_arrow_table())  # fmt: skip
    finally:
        con.unregister("_fit_cut")
    return finest, kept


def _bench_points(con) -> pl.DataFrame:
    # one point per nixlbench row: the run's average request (bytes, descriptors, NIXL's time)
    known = "SELECT count(*) FROM duckdb_views() WHERE view_name = 'nixlbench_points'"
    if not con.execute(known).fetchall()[0][0]:
        return pl.DataFrame()  # a connection without the store's tables (a hand-made one)
    return pl.from_arrow(con.sql(
        "SELECT link, xfer_us / 1e6 AS xfer_s, request_bytes AS bytes, batch_size AS descriptors "
        "FROM nixlbench_points WHERE xfer_us > 0 AND request_bytes > 0"
    ).to_arrow_table())  # fmt: skip


def _bench_fits(con) -> list[dict]:
    """A fit per link from its nixlbench points (scope and source 'nixlbench')."""
    points = _bench_points(con)
    groups = [
        (link, group)
        for (link,), group in (points.partition_by(["link"], as_dict=True).items() if points.height else [])
        if group.height >= MIN_TRANSFERS
    ]
    fits = _fit_links([(group, "descriptors") for _, group in groups])
    rows = []
    for (link, group), fit in zip(groups, fits, strict=True):
        if fit is None:
            continue
        rows.append({
            "scope": "nixlbench", **dict.fromkeys(_GROUPS["rank"]), "link": link, "source": "nixlbench",
            "reads": group.height, "transfers_used": fit.transfers, "fixed_s": fit.fixed_s,
            "bandwidth_bytes_per_s": fit.bandwidth_bytes_per_s, "per_descriptor_s": fit.per_descriptor_s,
            "bytes_per_descriptor": group["bytes"].sum() / group["descriptors"].sum(),
            "median_error_pct": fit.median_abs_error_pct, "note": fit.note,
        })  # fmt: skip
    return rows


def link_fits_frame(con) -> pl.DataFrame:
    """Every fit the store's reads allow, one row per (scope, group): per decode rank of an
    engine pair and route, per pair, per named link, and fleet-wide.

    The connector trace's successful timed reads; a store with none falls back to NIXL's
    own ring transfers, as ``fit_from_store`` does, whose rows name no peer and no link.
    Groups with fewer than ``MIN_TRANSFERS`` reads are not fitted; larger ones than
    ``MAX_FIT_READS`` are fitted on the sample of that many reads of lowest hash (the same
    reads give the same sample and the same fit, and more reads only ever displace some).
    """
    finest, kept, source = *_sampled_reads(con, _TRACE_READS), "trace"
    if finest.height == 0:
        finest, kept, source = *_sampled_reads(con, _RING_READS), "nixl"
    # a group made of the same finest groups as one fitted before (one pair on one link: its
    # pair, link and fleet fits) holds the same reads, so it has the same sample and fit
    samples: dict[frozenset, pl.DataFrame] = {}
    wanted: list[tuple[str, tuple, tuple, int, frozenset]] = []  # (scope, keys, values, reads, sample)
    finest_keys = list(_GROUPS["rank"])
    for scope, keys in _GROUPS.items():
        if finest.height == 0:
            break
        sizes = finest.filter(_in_scope(scope))
        members: dict[tuple, set] = {}
        for row in sizes.select(finest_keys).iter_rows():
            members.setdefault(tuple(row[finest_keys.index(k)] for k in keys), set()).add(row)
        # in key order: the fits come out in the same order whatever order the scan gave
        sizes = (
            sizes.group_by(list(keys)).agg(pl.col("n").sum()).sort(list(keys), nulls_last=True)
            if keys
            else sizes.select(pl.col("n").sum())
        )
        chosen = kept.filter(_in_scope(scope))
        if all(frozenset(m) in samples for m in members.values()):
            chosen = chosen.clear()  # every group's sample is known: no reads to split
        # each group's reads below its own threshold (as _sampled_reads computes it), cut in one
        # pass before the groups are split: its sample is the lowest of them
        own_share = _OVERSAMPLE * MAX_FIT_READS / pl.col("n")
        own = sizes.select(*keys, _hash_below(own_share).alias("own_below"))
        if keys:
            chosen = chosen.join(own, on=list(keys), how="left", nulls_equal=True)
        else:
            below = own["own_below"][0] if own.height else None
            chosen = chosen.with_columns(pl.lit(below, pl.UInt64).alias("own_below"))
        chosen = chosen.filter(pl.col("own_below").is_null() | (pl.col("h") < pl.col("own_below")))
        groups = chosen.partition_by(list(keys), as_dict=True) if keys else {(): chosen}
        for size in sizes.iter_rows(named=True):
            values = tuple(size[k] for k in keys)
            reads_in_group = size["n"]
            if reads_in_group < MIN_TRANSFERS:
                continue
            same = frozenset(members[values])
            if same not in samples:
                group = groups.get(values, chosen.clear())
                samples[same] = _group_sample(con, source, group, keys, values, reads_in_group)
            wanted.append((scope, keys, values, reads_in_group, same))
    # every sample fitted at once: one IRLS loop for all of them
    sets = [(sample, _descriptors_column(sample)) for sample in samples.values()]
    fits = dict(zip(samples, _fit_links(sets), strict=True))
    rows: list[dict] = []
    for scope, keys, values, reads_in_group, same in wanted:
        fit, sample = fits[same], samples[same]
        if fit is None:
            continue
        descriptors = sample["descriptors"].sum() if _descriptors_column(sample) else None
        rows.append({
            "scope": scope, **dict.fromkeys(_GROUPS["rank"]), **dict(zip(keys, values, strict=True)),
            "source": source, "reads": reads_in_group, "transfers_used": fit.transfers,
            "fixed_s": fit.fixed_s,
            "bandwidth_bytes_per_s": fit.bandwidth_bytes_per_s, "per_descriptor_s": fit.per_descriptor_s,
            "bytes_per_descriptor": sample["bytes"].sum() / descriptors if descriptors else None,
            "median_error_pct": fit.median_abs_error_pct, "note": fit.note,
        })  # fmt: skip
    rows += _bench_fits(con)
    return pl.DataFrame(rows, schema=_fit_types()) if rows else pl.DataFrame(schema=_fit_types())


def _group_sample(con, source: str, group: pl.DataFrame, keys: tuple, values: tuple,
                  reads_in_group: int) -> pl.DataFrame:  # fmt: skip
    """The sample one group is fitted on, from its reads below its threshold."""
    if reads_in_group > MAX_FIT_READS:
        # too few reads fell below the threshold for a sample: read the whole group
        if group.height < MAX_FIT_READS:
            group = _whole_group(con, source, dict(zip(keys, values, strict=True)))
        return group.sort("h", "xfer_s", "bytes", "descriptors").head(MAX_FIT_READS)
    return group.sort("h", "xfer_s", "bytes", "descriptors")


def _descriptors_column(sample: pl.DataFrame) -> str | None:
    # a read without a descriptor count would drop out of a fit with the term: leave it out
    return "descriptors" if sample["descriptors"].null_count() == 0 else None


def _whole_group(con, source: str, values: dict) -> pl.DataFrame:
    """Every read of one group: where its threshold kept fewer than the sample needs."""
    where = " AND ".join(f"{k} IS NOT DISTINCT FROM ?" for k in values) or "true"
    reads_sql = _TRACE_READS if source == "trace" else _RING_READS
    return pl.from_arrow(
        con.sql(f"SELECT * FROM ({reads_sql}) WHERE {where}", params=list(values.values())).to_arrow_table()
    )


def refresh_link_fits(con, fits: pa.Table | None = None) -> int:
    """Fill ``_link_fits`` (the table behind the ``link_fits`` view, queries/link_fit.sql)
    from the store behind ``con``, or with ``fits`` (an Arrow table of ``link_fits_frame``'s
    columns, fitted before on the same data); the number of fits."""
    table = link_fits_frame(con).to_arrow() if fits is None else fits
    con.execute("DELETE FROM _link_fits")
    if table.num_rows:
        con.register("_link_fits_new", table)
        con.execute("INSERT INTO _link_fits BY NAME SELECT * FROM _link_fits_new")
        con.unregister("_link_fits_new")
    return table.num_rows


def stored_link_fits(con) -> pa.Table:
    """The fits of the data behind ``con`` as an Arrow table: those an earlier connection on
    the same files fitted, when it kept them (``catalog.derived_table``), else fitted now."""
    from pathlib import Path

    from hybridtrace.store.catalog import derived_table

    code = Path(__file__).read_text(encoding="utf-8")  # another fit is another result
    return derived_table("linkfits", con, code, lambda: link_fits_frame(con).to_arrow())
