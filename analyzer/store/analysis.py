"""``open_analysis``: the one way the commands get a connection to a store for analysis.

``query``, ``analyze``, ``explain``, ``report``, ``verify``, ``model --link-from``, the
demo and the scheduled job all open the store here, so each gets the same connection: a
clear error where there is no store, the raw views over committed files
(``raw_views.py``), the ``engine_models`` view (every engine sized once,
``engine_models.py``), the finding thresholds (defaults, or a file's ``[thresholds]``),
the SQL views of ``queries/`` and the link fits they read (``link_fits``: fitted once from
the store's reads, ``analyze/link_fit.py``), each installed once.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hybridtrace.errors import UsageError
from hybridtrace.store.commit import Store

if TYPE_CHECKING:
    import duckdb


class NoStoreError(UsageError):
    """The path names no hybridtrace store (no ``_meta.json`` under it)."""


def open_analysis(
    store: str | Path | Store,
    *,
    config: str | Path | None = None,
    views: bool = True,
    missing: str | None = None,
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection on the store at ``store``, ready for the analysis.

    ``config`` is a TOML file with a ``[thresholds]`` table (default: ./hybridtrace.toml
    when there is one). ``views=False`` leaves out the thresholds and ``queries/`` (raw views
    and ``engine_models`` only: what ``verify`` reads). ``missing`` replaces the hint of the
    error raised where there is no store.
    """
    opened = store if isinstance(store, Store) else Store(store)
    if not opened.exists():
        where = str(store) if not isinstance(store, Store) else str(opened)
        hint = missing if missing is not None else f" (run 'hybridtrace ingest PATH --store {where}' first)"
        raise NoStoreError(f"{where}: no store here{hint}")
    thresholds = None
    if views:
        from hybridtrace.analyze.thresholds import load as load_thresholds

        thresholds = load_thresholds(config)  # a bad file is refused before the store is read
    return analysis_connection(opened, thresholds=thresholds, views=views)


def analysis_connection(
    store: Store, *, thresholds: dict[str, float] | None = None, views: bool = True
) -> duckdb.DuckDBPyConnection:
    """Raw views, ``engine_models`` and (with ``views``) thresholds, ``queries/``, link fits on ``store``."""
    if not views:
        return _base(store, False, None)
    import duckdb

    try:
        return _catalog_connection(store, thresholds, in_memory=False)
    except (OSError, duckdb.IOException):
        # the connection's own file could not be written (its directory full, as a container's
        # small /dev/shm can be): the same connection in memory, its views bound here. An error
        # of the store's own files is raised again by this one.
        return _catalog_connection(store, thresholds, in_memory=True)


def _catalog_connection(
    store: Store, thresholds: dict[str, float] | None, *, in_memory: bool
) -> duckdb.DuckDBPyConnection:
    from hybridtrace.analyze.link_fit import refresh_link_fits, stored_link_fits
    from hybridtrace.queries_loader import install_views, sql_modules
    from hybridtrace.store.catalog import CatalogConnection, base_objects

    # the views of queries/ come bound already from the template when the store's base
    # objects are the ones they were bound over (catalog.py); else they are installed here
    opened = CatalogConnection(in_memory=in_memory)
    if opened.from_template:
        query_names = opened.query_names()
        opened.clear_base()
        con = _base(store, thresholds, opened.con)
        if not opened.views_hold(query_names):
            install_views(con)  # each made again, bound over this store's base objects
    else:
        con = _base(store, thresholds, opened.con)
        base = base_objects(con)
        install_views(con)
        defined = {name for module in sql_modules() for name in module.defines}
        if not defined & {row[0] for row in base}:  # a view of queries/ never stands in for a base one
            opened.save_template(base)
    # fitted once per state of the data: a connection on an unchanged store reads them back
    refresh_link_fits(con, stored_link_fits(con))
    return con


def _base(
    store: Store, thresholds: dict[str, float] | bool | None, con: duckdb.DuckDBPyConnection | None
) -> duckdb.DuckDBPyConnection:
    """The objects the views of ``queries/`` read: raw views, ``engine_models``, thresholds
    (``thresholds`` None: the defaults; False: none)."""
    from hybridtrace.store.engine_models import register_engine_models
    from hybridtrace.store.raw_views import raw_connection

    con = raw_connection(store, con=con)
    # which store this is, for the incremental analysis' state (analyze/incremental.py)
    con.execute("CREATE TEMP TABLE _analysis_store AS SELECT CAST(? AS VARCHAR) AS location",
                [store.location])  # fmt: skip
    register_engine_models(con)
    if thresholds is not False:
        from hybridtrace.analyze.thresholds import install as install_thresholds

        install_thresholds(con, thresholds)
    return con
