"""The analysis connection's own database, started from a catalog bound before (``store/catalog.py``)."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import duckdb
import pytest

from hybridtrace.analyze import analyze
from hybridtrace.analyze.rules import FINDING_COLUMNS, RULES
from hybridtrace.store import catalog, open_analysis
from hybridtrace.store.analysis import _base
from hybridtrace.store.commit import Store


@pytest.fixture
def where(tmp_path, monkeypatch) -> Path:
    """A directory of this test's own for the template and the connections' files."""
    folder = tmp_path / "catalog"
    folder.mkdir(mode=0o700)
    monkeypatch.setattr(catalog, "_directory", lambda: folder)
    return folder


def _templates(folder: Path) -> list[Path]:
    return sorted(folder.glob("catalog-*.duckdb"))


def _rows(con) -> list[tuple]:
    result = analyze(con)
    return sorted((tuple(r.values()) for r in result.findings), key=repr)


def test_a_connection_from_the_template_analyses_as_one_that_installed_the_views(where, demo_store):
    first = open_analysis(demo_store)
    assert len(_templates(where)) == 1, "the first connection saves its catalog"
    assert catalog.CatalogConnection().from_template
    second = open_analysis(demo_store)
    assert _rows(second) == _rows(first)
    # and as a connection in memory, with every view installed by hand
    catalog_dir = catalog._directory
    try:
        catalog._directory = lambda: None
        in_memory = open_analysis(demo_store)
    finally:
        catalog._directory = catalog_dir
    assert _rows(in_memory) == _rows(second)
    names = "SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY 1"
    assert second.execute(names).fetchall() == in_memory.execute(names).fetchall()
    tables = "SELECT table_name FROM duckdb_tables() ORDER BY 1"
    assert second.execute(tables).fetchall() == in_memory.execute(tables).fetchall()


def test_base_objects_of_another_shape_keep_the_template_views_out(where, demo_store):
    open_analysis(demo_store)
    opened = catalog.CatalogConnection()
    names = opened.query_names()
    opened.clear_base()
    con = _base(Store(demo_store), None, opened.con)
    assert opened.views_hold(names)
    # a raw view whose column has another type (as an older store's files may have it)
    con.execute("CREATE OR REPLACE VIEW transfers AS SELECT * REPLACE (CAST(rank AS BIGINT) AS rank) "
                "FROM (SELECT * FROM transfers LIMIT 0)")  # fmt: skip
    assert not opened.views_hold(names)


def test_where_the_template_views_do_not_hold_they_are_made_again(where, demo_store, monkeypatch):
    expected = _rows(open_analysis(demo_store))
    [template] = _templates(where)
    # the template's rule views made to find nothing: only views made again find what they should
    edit = duckdb.connect(str(template))
    nothing = ", ".join(f"CAST(NULL AS {kind}) AS {column}" for column, kind, _ in FINDING_COLUMNS)
    for rule in RULES:
        edit.execute(f"CREATE OR REPLACE VIEW {rule.view} AS SELECT {nothing} WHERE false")
    edit.close()
    assert _rows(open_analysis(demo_store)) == [], "the edited template is the one used"
    monkeypatch.setattr(catalog.CatalogConnection, "views_hold", lambda self, names: False)
    assert _rows(open_analysis(demo_store)) == expected


def test_a_template_that_cannot_be_read_is_set_aside(where, demo_store):
    expected = _rows(open_analysis(demo_store))
    [template] = _templates(where)
    template.write_bytes(template.read_bytes()[:4096])  # cut short, as a full disk leaves it
    assert _rows(open_analysis(demo_store)) == expected
    assert len(_templates(where)) == 1, "a sound template is saved again"


def test_each_connection_file_goes_with_its_connection(where, demo_store):
    con = open_analysis(demo_store)
    assert list(where.glob("conn-*"))
    del con
    gc.collect()
    assert not list(where.glob("conn-*"))


def test_files_of_processes_that_are_gone_are_removed(where):
    gone = where / "conn-999999999-0-deadbeef.duckdb"
    gone.write_bytes(b"")
    half = where / "partial-999999999-feed.duckdb"
    half.write_bytes(b"")
    ours = where / f"conn-{os.getpid()}-0-cafe.duckdb"
    ours.write_bytes(b"")
    catalog._sweep(where)
    assert not gone.exists() and not half.exists() and ours.exists()


def test_derived_tables_older_versions_kept_beside_the_connections_go_on_sight(where):
    flat = where / f"linkfits-{'a' * 32}.arrow"
    flat.write_bytes(b"")
    template = where / "catalog-0000.duckdb"
    template.write_bytes(b"")
    catalog._sweep(where)
    assert not flat.exists() and template.exists()


def test_derived_tables_kept_are_the_most_recently_used_of_each_kind(where, monkeypatch):
    import pyarrow as pa

    monkeypatch.setattr(catalog, "KEPT_PER_KIND", 4)
    folder = catalog._derived_directory()
    assert folder == where / "derived"
    stamp = os.path.getmtime(folder) - 3600
    older = []
    for i in range(6):  # used one minute apart, the last one most recently
        path = folder / f"linkfits-{i:032x}.arrow"
        path.write_bytes(b"")
        os.utime(path, (stamp + 60 * i, stamp + 60 * i))
        older.append(path)
    other_kind = folder / f"repeats-{0:032x}.arrow"
    other_kind.write_bytes(b"")
    os.utime(other_kind, (stamp, stamp))
    half = folder / "partial-999999999-feed.arrow"  # a write cut short by a process now gone
    half.write_bytes(b"")
    table = catalog.derived_table("linkfits", None, "new code", lambda: pa.table({"x": [1]}), of_views=False)
    assert table.column("x").to_pylist() == [1]
    kept = sorted(p.name for p in folder.glob("linkfits-*.arrow"))
    # the new one and the three used last of the others; the other kind and its age untouched
    assert len(kept) == 4 and {p.name for p in older[3:]} <= set(kept)
    assert other_kind.exists() and not half.exists()
    # read back, not computed, by the next connection on the same data
    again = catalog.derived_table("linkfits", None, "new code", lambda: pytest.fail("computed again"),
                                  of_views=False)  # fmt: skip
    assert again.equals(table)


def test_a_directory_that_cannot_take_a_connection_file_leaves_it_in_memory(where, demo_store, monkeypatch):
    expected = _rows(open_analysis(demo_store))

    def full(self):
        raise duckdb.IOException("IO Error: could not write file: No space left on device")

    monkeypatch.setattr(catalog.CatalogConnection, "_open", full)
    con = open_analysis(demo_store)
    in_memory = "SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
    assert con.execute(in_memory).fetchone() == (None,)
    assert _rows(con) == expected


def test_a_directory_others_can_write_to_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setattr(catalog.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(catalog, "Path", _no_shm(catalog.Path))
    folder = tmp_path / f"hybridtrace-catalog-{os.getuid()}"
    folder.mkdir(mode=0o700)
    assert catalog._directory() == folder
    folder.chmod(0o777)
    assert catalog._directory() is None


def _no_shm(real: type[Path]):
    def make(*parts):
        return real("/nonexistent-shm") if parts == ("/dev/shm",) else real(*parts)

    return make


def test_templates_no_connection_used_for_a_week_go_when_another_is_saved(where, demo_store):
    stale = where / "catalog-0000.duckdb"
    recent = where / "catalog-1111.duckdb"
    stale.write_bytes(b"")
    recent.write_bytes(b"")
    week_ago = os.path.getmtime(stale) - 8 * 86400
    os.utime(stale, (week_ago, week_ago))
    open_analysis(demo_store)
    assert not stale.exists() and recent.exists()
    assert len(_templates(where)) == 2


def _fits(con) -> list[tuple]:
    return con.execute("SELECT * FROM link_fits ORDER BY ALL").fetchall()


def test_link_fits_are_fitted_once_per_state_of_the_data(where, tmp_path, demo_store, monkeypatch):
    import shutil

    from hybridtrace.analyze import link_fit
    from hybridtrace.ingest.run import ingest
    from hybridtrace.simulate import SimOptions, simulate

    store = tmp_path / "store"
    shutil.copytree(demo_store, store)
    fitted = _fits(open_analysis(store))
    assert fitted and len(list((where / "derived").glob("linkfits-*.arrow"))) == 1
    # the same files: the next connection reads the fits back, and they are the same
    fit = link_fit.link_fits_frame
    monkeypatch.setattr(link_fit, "link_fits_frame", lambda con: pytest.fail("fitted again"))
    assert _fits(open_analysis(store)) == fitted
    # an analysis that keeps its state in the store changes no data the fits read
    analyze(open_analysis(store), incremental=True)
    assert _fits(open_analysis(store)) == fitted
    # a kept table that cannot be read is fitted again, and kept anew
    [kept] = (where / "derived").glob("linkfits-*.arrow")
    kept.write_bytes(b"not arrow")
    monkeypatch.setattr(link_fit, "link_fits_frame", fit)
    assert _fits(open_analysis(store)) == fitted
    assert kept.read_bytes()[:6] == b"ARROW1"
    # a batch more: other files, other fits, fitted from all of them
    simulate(SimOptions(seed=11, duration_s=10), tmp_path / "more")
    ingest([tmp_path / "more"], store)
    grown = open_analysis(store)
    assert _fits(grown) != fitted and len(list((where / "derived").glob("linkfits-*.arrow"))) == 2
    monkeypatch.setattr(catalog, "_directory", lambda: None)  # nothing kept: fitted here
    assert _fits(open_analysis(store)) == _fits(grown)
