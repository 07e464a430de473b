"""Thresholds of the finding rules: sound defaults, overridable in ``hybridtrace.toml``.

The rules read them from the ``_thresholds`` table, so SQL and docs share one list::

    [thresholds]
    descriptor_post_share = 0.5
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import duckdb

from hybridtrace.errors import UsageError
from hybridtrace.toml_files import read_toml


@dataclass(frozen=True)
class Threshold:
    name: str
    default: float
    doc: str
    low: float = 0.0  # the smallest value that makes sense
    high: float = math.inf
    low_open: bool = False  # the low bound itself is not allowed


THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "excess_min_bytes",
        4096,
        "bytes a read may exceed its expected size before it counts (slack for rounding)",
    ),
    Threshold(
        "unsharded_factor",
        1.5,
        "state moved over the rank's shard at or above which a rank pulled unsharded state",
        low=1.0,
    ),
    Threshold(
        "descriptor_post_share",
        0.5,
        "share of a read's transfer time spent posting descriptors that makes it descriptor-bound",
        high=1.0,
        low_open=True,
    ),
    Threshold(
        "slow_rank_ratio",
        0.6,
        "a rank is slow in a window when its median bandwidth is below this share of its peers'",
        high=1.0,
        low_open=True,
    ),
    Threshold(
        "slow_rank_windows",
        0.5,
        "share of a rank's windows it must be slow in to be reported (persistence)",
        high=1.0,
        low_open=True,
    ),
    Threshold(
        "slow_rank_fit_ratio",
        0.6,
        "the fitted link agrees a rank is slow when its fitted bandwidth is below this share of its "
        "peers' median (same engine pair and route)",
        high=1.0,
        low_open=True,
    ),
    Threshold("slow_rank_min_reads", 3, "reads a rank needs in a window for the window to count", low=1.0),
    Threshold("window_s", 10, "length of the time windows slow ranks are judged in, seconds", low_open=True),
    Threshold(
        "recompute_margin",
        1.0,
        "the handoff must exceed the prefill time by this factor to report recompute_cheaper",
        low_open=True,
    ),
    Threshold(
        "prefill_tokens_per_s",
        0,
        "the decoder's prefill rate for requests without a measured prefill_s, tokens/s; "
        "0 estimates it from the engine's peak logged prompt throughput",
    ),
    Threshold(
        "link_bytes_per_s",
        50e9,
        "bytes per second one rank's link carries at most (50e9: a 400 Gb/s NIC); a speed an engine "
        "reports above it is named beside its byte excess",
        low_open=True,
    ),
)
DEFAULTS = {t.name: t.default for t in THRESHOLDS}


def load(path: str | Path | None = None) -> dict[str, float]:
    """Defaults, overridden by ``[thresholds]`` of ``path`` (or ./hybridtrace.toml when present)."""
    values = dict(DEFAULTS)
    candidate = Path(path) if path else Path("hybridtrace.toml")
    if path or candidate.exists():  # a named file must exist; the default one may not
        raw = read_toml(candidate, "config file").get("thresholds", {})
        if not isinstance(raw, dict):
            raise UsageError(f"{candidate}: [thresholds] must be a table")
        spec = {t.name: t for t in THRESHOLDS}
        for name, value in raw.items():
            if name not in values:
                raise UsageError(f"{candidate}: unknown threshold {name!r} (known: {', '.join(values)})")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise UsageError(f"{candidate}: threshold {name} must be a finite number, not {value!r}")
            t = spec[name]
            if value < t.low or (t.low_open and value == t.low) or value > t.high:
                low = f"above {t.low:g}" if t.low_open else f"at least {t.low:g}"
                high = f" and at most {t.high:g}" if math.isfinite(t.high) else ""
                raise UsageError(f"{candidate}: threshold {name} must be {low}{high}, not {value!r}")
            values[name] = float(value)
    return values


def install(con: duckdb.DuckDBPyConnection, values: dict[str, float] | None = None) -> None:
    """(Re)create the ``_thresholds`` table, and the ``_t`` macro the rules read it through.

    ``_t`` is redefined to read each value from a variable of this connection
    (``hybridtrace_t_<name>``), which DuckDB resolves to a constant as it binds; ``_macros.sql``
    defines it as a look-up of the table, for a connection without them. A look-up is a
    subquery that every use binds and plans again, about a millisecond each; a ``CASE`` over
    every name, the form before this one, is an expression of every value that each use binds
    and folds again (0.25 ms a use, and the rules hold dozens). A constant, as both are in the
    end, is what lets a filter on a threshold reach the Parquet scans.

    The variables belong to this connection (a cursor of it would read nulls through the macro):
    an analysis runs on the one connection this installs them on.
    """
    values = values or DEFAULTS
    rows = [(k, float(v)) for k, v in values.items()]
    # one statement, not one insert a value: each statement costs DuckDB a few hundred microseconds
    con.execute(
        "CREATE OR REPLACE TABLE _thresholds AS SELECT name, value FROM "
        "(SELECT unnest(?::VARCHAR[]) AS name, unnest(?::DOUBLE[]) AS value)",
        [[k for k, _ in rows], [v for _, v in rows]],
    )
    # the names are THRESHOLDS' own (load refuses any other), so they need no quoting
    for name, value in rows:
        con.execute(f"SET VARIABLE {_VARIABLE}{name} = CAST('{value!r}' AS DOUBLE)")
    con.execute(f"CREATE OR REPLACE MACRO _t(n) AS getvariable('{_VARIABLE}' || n)")


# The prefix of the connection variables ``install`` sets, one a threshold.
_VARIABLE = "hybridtrace_t_"
