"""The scrapes' intervals in the incremental analysis' state: each run computes the scrapes its
new samples make or change, not every scrape of the store.

A scrape's interval (``_prom_scrape_intervals``: one row per instance, target, engine label,
model name and time) is the growth of its samples since each series' sample before: it rests
on the samples at its time and on each one's predecessor in its series, nothing else. A run
holding new samples therefore recomputes the scrapes at their times (``new``), and the scrape
of each series' next older sample after a new one (``next``: a sample that arrives late
becomes that one's predecessor); the other scrapes keep their stored rows. A reset, which is
decided per scrape from that scrape's samples and their predecessors, is recomputed with it.

To find predecessors and next samples without reading the store's scrapes, the state keeps
per series and UTC day the first and last sample the runs saw (``analysis_scrape_series``).
The samples of a recomputed scrape time, and a predecessor or next sample the day's first
and last do not give (a late sample falls between them), are read from the store, from that
day's files only. Samples are never removed, so a recomputed scrape never loses its row: a
stored row counts until a later one for the same scrape replaces it.

The instance is resolved to its engine when the rows are read (``_prom_intervals``): a
folder's engine can be named by a log that arrives later.
"""

from __future__ import annotations

import duckdb

__all__ = ["SCRAPE_KEY", "merge_scrapes", "no_scrapes", "scope_scrapes"]

# A scrape, as _prom_scrape_intervals groups its samples.
SCRAPE_KEY = ("instance", "target", "engine_label", "model_name", "end_ts")
# A series of prom_samples.
_SERIES = ("instance", "metric", "labels", "le")


def _same(columns: tuple[str, ...], left: str, right: str) -> str:
    """A join condition on ``columns`` in which a null matches a null (a series without le)."""
    return " AND ".join(f"{left}.{c} IS NOT DISTINCT FROM {right}.{c}" for c in columns)


def _days(con: duckdb.DuckDBPyConnection, sql: str) -> str:
    """The days a relation's ``day`` column holds, as an ``IN`` list: spelled out, so that the
    scans of prom_samples skip the files of other days by their statistics."""
    found = [d for (d,) in con.execute(f"SELECT DISTINCT day FROM ({sql}) WHERE day IS NOT NULL").fetchall()]
    return "(" + (", ".join(f"DATE '{d}'" for d in found) or "NULL") + ")"


def scope_scrapes(con: duckdb.DuckDBPyConnection, *, full: bool, full_seq: int, new_sources: str) -> int:
    """``_scope_scrapes`` (the scrapes this run computes, as ``_prom_scrape_intervals`` gives
    them, with ``recomputed``) and ``_scope_scrape_series`` (the first and last of this run's
    samples per series and day). A full run computes every scrape; an incremental one those its
    new samples (from the sources of ``new_sources``, SQL of a ``source_id IN`` list or
    subquery) make or change, from the state since the last full run ``full_seq``. Returns how
    many scrapes it computed."""
    if full:
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _scope_scrapes AS "
            "SELECT *, false AS recomputed FROM _prom_scrape_intervals"
        )
        _series_of(con, "prom_samples")
        return _scalar(con, "SELECT count(*) FROM _scope_scrapes")
    con.execute(
        "CREATE OR REPLACE TEMP TABLE _new_samples AS "
        f"SELECT * FROM prom_samples WHERE source_id IN {new_sources} "
        "UNION ALL SELECT * FROM prom_samples WHERE source_id IS NULL"
    )
    _series_of(con, "_new_samples")
    if not _scalar(con, "SELECT count(*) FROM _new_samples"):
        no_scrapes(con)
        return 0
    series = ", ".join(_SERIES)

    def old(column: str) -> str:
        """Whether a sample (its ``column``, a source id) is one an earlier run saw."""
        return f"NOT coalesce({column} IN {new_sources}, true)"

    # the state's days of the new samples' instances, from the day before the earliest new one
    # on: each series' first and last sample of the day, as the runs since the full one saw them
    # (days before that are read only for a predecessor these do not hold, below)
    window = _scalar(con, "SELECT coalesce(min(day) - 1, DATE '0001-01-01') FROM _new_samples")
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE _old_days AS
        SELECT {series}, day, min(first_ts) AS first_ts, max(last_ts) AS last_ts,
               arg_max(last_value, last_ts) AS last_value
        FROM analysis_scrape_series
        WHERE seq >= {full_seq} AND day >= DATE '{window}'
          AND instance IN (SELECT DISTINCT instance FROM _new_samples)
        GROUP BY ALL
        """
    )
    # each new sample's next older one, when an earlier run saw a later sample of its series:
    # the first day after it holding one; that day's first sample unless the new one falls
    # inside the day's span (then read from that day's files)
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE _next_days AS
        SELECT n.instance, n.metric, n.labels, n.le, n.ts AS x, o.day, o.first_ts
        FROM (SELECT DISTINCT {series}, ts, day FROM _new_samples) n
        JOIN _old_days o ON {_same(_SERIES, 'o', 'n')} AND o.day >= n.day AND o.last_ts > n.ts
        QUALIFY row_number() OVER (PARTITION BY n.instance, n.metric, n.labels, n.le, n.ts ORDER BY o.day) = 1
        """
    )
    inside = "SELECT * FROM _next_days WHERE first_ts <= x"
    read_next = ""
    if _scalar(con, f"SELECT count(*) FROM ({inside})"):
        read_next = f"""
            UNION ALL
            SELECT q.instance, min(p.ts) FROM ({inside}) q
            JOIN prom_samples p ON {_same(_SERIES, 'p', 'q')} AND p.day = q.day AND p.ts > q.x
            WHERE p.day IN {_days(con, inside)} AND {old('p.source_id')}
            GROUP BY q.instance, q.metric, q.labels, q.le, q.x"""
    # the scrape times to compute, per instance: the new samples', and their next older ones'
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE _scrape_times AS
        SELECT DISTINCT instance, ts, CAST(make_timestamp(CAST(ts * 1e6 AS BIGINT)) AS DATE) AS day FROM (
            SELECT instance, ts FROM _new_samples
            UNION ALL SELECT instance, first_ts FROM _next_days WHERE first_ts > x
            {read_next}
        )
        """
    )
    # the samples at those times: the new ones, and those earlier runs saw (read from the
    # store only at the times some series' span of that day holds: a late or re-read scrape)
    seen = """
        SELECT DISTINCT t.instance, t.ts, t.day FROM _scrape_times t
        JOIN _old_days o ON o.instance IS NOT DISTINCT FROM t.instance AND o.day = t.day
         AND o.first_ts <= t.ts AND o.last_ts >= t.ts"""
    old_at_times = ""
    if _scalar(con, f"SELECT count(*) FROM ({seen})"):
        old_at_times = f"""
            UNION ALL BY NAME
            SELECT p.* FROM prom_samples p
            SEMI JOIN ({seen}) t ON t.instance IS NOT DISTINCT FROM p.instance AND t.ts = p.ts
            WHERE p.day IN {_days(con, seen)} AND {old('p.source_id')}"""
    con.execute(f"CREATE OR REPLACE TEMP TABLE _scrape_cut AS SELECT * FROM _new_samples {old_at_times}")
    _predecessors(con, series, old('p.source_id'), window, full_seq)
    # the scrapes at those times, from their samples and the predecessors (the view's window
    # gives each sample the one before it among these rows, which is its predecessor in the store)
    from hybridtrace.analyze.view_swap import swapped_views

    cut = "SELECT * FROM _scrape_cut UNION ALL BY NAME SELECT * FROM _scrape_before"
    with swapped_views(con, {"prom_samples": cut}):
        con.execute(
            """
            CREATE OR REPLACE TEMP TABLE _scope_scrapes AS
            SELECT s.*,
                   s.end_ts <= coalesce((SELECT max(o.last_ts) FROM _old_days o
                                         WHERE o.instance IS NOT DISTINCT FROM s.instance), '-inf'::DOUBLE)
                       AS recomputed
            FROM _prom_scrape_intervals s
            SEMI JOIN _scrape_times t ON t.instance IS NOT DISTINCT FROM s.instance AND t.ts = s.end_ts
            """
        )
    return _scalar(con, "SELECT count(*) FROM _scope_scrapes")


def _predecessors(
    con: duckdb.DuckDBPyConnection, series: str, seen: str, window: object, full_seq: int
) -> None:
    """``_scrape_before``: for each sample of ``_scrape_cut``, the latest sample an earlier run
    saw of its series before it, unless the cut holds that one already (a new sample's
    predecessor among the new ones is in the cut too). ``seen`` tells such a sample of
    prom_samples (``p``) from a new one."""
    # the latest day of the window whose first sample is before it: that day's last sample,
    # unless the cut's sample falls inside the day's span (then read from that day's files)
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE _before_days AS
        SELECT c.instance, c.metric, c.labels, c.le, c.ts AS t, o.day, o.last_ts, o.last_value
        FROM (SELECT DISTINCT {series}, ts, day FROM _scrape_cut) c
        JOIN _old_days o ON {_same(_SERIES, 'o', 'c')} AND o.day <= c.day AND o.first_ts < c.ts
        QUALIFY row_number() OVER (PARTITION BY c.instance, c.metric, c.labels, c.le, c.ts
                                   ORDER BY o.day DESC) = 1
        """
    )
    found = ["SELECT instance, metric, labels, le, last_ts AS ts, last_value AS value FROM _before_days "
             "WHERE last_ts < t"]  # fmt: skip
    inside = "SELECT * FROM _before_days WHERE last_ts >= t"
    if _scalar(con, f"SELECT count(*) FROM ({inside})"):
        found.append(
            f"""
            SELECT q.instance, q.metric, q.labels, q.le, max(p.ts), arg_max(p.value, p.ts)
            FROM ({inside}) q
            JOIN prom_samples p ON {_same(_SERIES, 'p', 'q')} AND p.day = q.day AND p.ts < q.t
            WHERE p.day IN {_days(con, inside)} AND {seen}
            GROUP BY q.instance, q.metric, q.labels, q.le, q.t"""
        )
    # a series the window holds nothing of before the sample: its last sample of the days
    # before the window, if any (a series new in this run, or one that paused for days)
    earlier = f"""
        SELECT DISTINCT {series} FROM _scrape_cut c
        ANTI JOIN _before_days b ON {_same(_SERIES, 'b', 'c')} AND b.t = c.ts"""
    if _scalar(con, f"SELECT count(*) FROM ({earlier})"):
        found.append(
            f"""
            SELECT o.instance, o.metric, o.labels, o.le, max(o.last_ts), arg_max(o.last_value, o.last_ts)
            FROM analysis_scrape_series o SEMI JOIN ({earlier}) e ON {_same(_SERIES, 'o', 'e')}
            WHERE o.seq >= {full_seq} AND o.day < DATE '{window}'
            GROUP BY o.instance, o.metric, o.labels, o.le"""
        )
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE _scrape_before AS
        SELECT DISTINCT b.*, CAST(make_timestamp(CAST(b.ts * 1e6 AS BIGINT)) AS DATE) AS day
        FROM ({' UNION ALL '.join(found)}) b
        ANTI JOIN _scrape_cut c ON {_same(_SERIES, 'c', 'b')} AND c.ts = b.ts
        """
    )


def no_scrapes(con: duckdb.DuckDBPyConnection) -> None:
    """No scrape computed (no new read wrote samples): the scope's scrape tables, empty."""
    con.execute("CREATE OR REPLACE TEMP TABLE _scope_scrapes AS "
                "SELECT * EXCLUDE (seq) FROM analysis_scrapes LIMIT 0")  # fmt: skip
    con.execute("CREATE OR REPLACE TEMP TABLE _scope_scrape_series AS "
                "SELECT * EXCLUDE (seq) FROM analysis_scrape_series LIMIT 0")  # fmt: skip


def _series_of(con: duckdb.DuckDBPyConnection, samples: str) -> None:
    """``_scope_scrape_series``: the first and last sample per series and day of ``samples``."""
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE _scope_scrape_series AS
        SELECT {', '.join(_SERIES)}, day, min(ts) AS first_ts, max(ts) AS last_ts,
               arg_max(value, ts) AS last_value
        FROM {samples} WHERE ts IS NOT NULL GROUP BY ALL
        """
    )


def merge_scrapes(con: duckdb.DuckDBPyConnection, *, full: bool, seq: int, full_seq: int) -> None:
    """``_merged_scrapes``: every scrape's row, the stored ones that still count (since the last
    full run ``full_seq``) with this run's (``seq``); a view, read once by the analysis."""
    key = ", ".join(SCRAPE_KEY)
    stored = (
        ""
        if full
        else f"""
        SELECT x.* EXCLUDE (seq, recomputed) FROM analysis_scrapes x
        LEFT JOIN (
            SELECT {key}, max(seq) AS seq FROM (
                SELECT {key}, seq FROM analysis_scrapes WHERE recomputed AND seq > {full_seq}
                UNION ALL SELECT {key}, {seq} FROM _scope_scrapes
            ) GROUP BY ALL
        ) later ON {_same(SCRAPE_KEY, 'later', 'x')}
        WHERE x.seq >= {full_seq} AND (later.seq IS NULL OR later.seq <= x.seq)
        UNION ALL BY NAME"""
    )
    con.execute(
        f"CREATE OR REPLACE TEMP VIEW _merged_scrapes AS {stored} "
        "SELECT * EXCLUDE (recomputed) FROM _scope_scrapes"
    )


def _scalar(con: duckdb.DuckDBPyConnection, sql: str):
    return con.execute(sql).fetchall()[0][0]
