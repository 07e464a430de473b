"""A store other engines read correctly: Hive's null partitions, and Iceberg tables of the
committed state (``hybridtrace.store.iceberg``).

Every Iceberg check counts each table three ways — pyiceberg's own scan, DuckDB over the
files the current snapshot lists, and (in ``test_iceberg_spark.py``) Spark over them — and
compares with hybridtrace's own views (``Store.connect``): after an ingest, right after a
compaction (the superseded files still on disk), after an ingest killed between its data
files and its commit, and after one killed between the store's commit and Iceberg's. The
negative control: a plain read of the table folders over-counts in the last cases.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pytest
from storefaults import kill_writes

import hybridtrace.ingest.run as ingest_run
import hybridtrace.store.commit as commit
from hybridtrace.errors import StoreWriteError, UsageError
from hybridtrace.ingest.run import ingest
from hybridtrace.schema import TABLES, table_schema
from hybridtrace.simulate import SimOptions, simulate
from hybridtrace.store import Store
from hybridtrace.store.raw_views import _raw_view

ICEBERG = importlib.util.find_spec("pyiceberg") is not None
needs_iceberg = pytest.mark.skipif(not ICEBERG, reason="needs the iceberg extra (pip install '.[iceberg]')")

# A process killed between its data files and its commit: it dies as it writes the commit.
KILLED_INGEST = """
import os, signal, sys
import hybridtrace.store.roots as roots
write = roots.LocalRoot.write_parquet
def killed(self, table, rel):
    if rel.startswith("sources/part-"):
        os.kill(os.getpid(), signal.SIGKILL)
    write(self, table, rel)
roots.LocalRoot.write_parquet = killed
from hybridtrace.ingest.run import ingest
ingest([sys.argv[1]], sys.argv[2])
"""


def view_counts(root: Path | str) -> dict[str, int]:
    """Rows of each table as hybridtrace's views read them (every committed record)."""
    con = Store(root).connect(with_queries=False)
    return {t: _count(con, _raw_view(table_schema(t).view)) for t in TABLES}


def _count(con, source: str) -> int:
    return con.sql(f"SELECT count(*) FROM {source}").fetchall()[0][0]


def _count_files(files: list) -> int:
    import duckdb

    listing = ", ".join(f"'{f}'" for f in files)
    return _count(duckdb.connect(), f"read_parquet([{listing}])") if files else 0


def iceberg_counts(root: Path | str) -> dict[str, int]:
    """Rows of each Iceberg table by pyiceberg's scan."""
    from hybridtrace.store import iceberg

    with iceberg.catalog(Store(root), write=False) as ice:
        return {t: ice.load_table((iceberg.NAMESPACE, t)).scan().to_arrow().num_rows for t in TABLES}


def snapshot_counts(root: Path | str) -> dict[str, int]:
    """Rows of the files each Iceberg table's current snapshot lists, read by DuckDB."""

    from hybridtrace.store import iceberg

    out = {}
    for table in TABLES:
        files = [f.removeprefix("file://") for f in iceberg.snapshot_files(Store(root), table)]
        out[table] = _count_files(files)
    return out


def folder_counts(root: Path) -> dict[str, int]:
    """What a plain reader of the table folders counts: every Parquet file there."""

    out = {}
    for table in TABLES:
        out[table] = _count_files(list((root / table).rglob("part-*.parquet")))
    return out


def assert_exact(root: Path) -> dict[str, int]:
    want = view_counts(root)
    assert sum(want.values()) > 0
    assert iceberg_counts(root) == want
    assert snapshot_counts(root) == want
    return want


def _bundle(tmp_path: Path, seed: int, name: str) -> Path:
    root = tmp_path / name
    simulate(SimOptions(seed=seed, duration_s=8), root)
    return root


def _enabled_store(tmp_path: Path) -> Path:
    from hybridtrace.store import iceberg

    root = tmp_path / "store"
    iceberg.enable(Store(root))
    return root


# --- Hive's null partitions ----------------------------------------------------------------


def _null_rows() -> pa.Table:
    """Three reads: two with no time (a null day), one of them of no engine, one of an engine "None"."""
    schema = table_schema("transfers")
    rows = [
        {"ts": None, "request_id": "a", "engine_id": None, "rank": 0, "status": "ok", "line_number": 1},
        {"ts": None, "request_id": "b", "engine_id": "None", "rank": 0, "status": "ok", "line_number": 2},
        {"ts": 1.79e9, "request_id": "c", "engine_id": "d0", "rank": 0, "status": "ok", "line_number": 3},
    ]
    data = pa.Table.from_pylist(rows)
    import pyarrow.compute as pc

    day = pc.cast(pc.cast(pc.multiply(data["ts"], 1e6), pa.int64()).cast(pa.timestamp("us")), pa.date32())
    return schema.conform(data.append_column("day", day))


def _write(root: Path, data: pa.Table) -> None:
    store = Store(root)
    store.init()
    with store.writer_lock():
        no_sources = table_schema("sources").arrow_schema().empty_table()
        store.write_batch(commit.new_batch_id(), {"transfers": data}, no_sources)


def _rows(root: Path) -> list[tuple]:
    con = Store(root).connect(with_queries=False)
    return sorted(con.sql("SELECT request_id, engine_id, day FROM transfers").fetchall(), key=repr)


def _dirs(root: Path) -> set[str]:
    return {str(p.parent.relative_to(root)) for p in (root / "transfers").rglob("part-*.parquet")}


def test_a_null_partition_is_named_hives_way_and_a_none_string_apart(tmp_path):
    _write(tmp_path / "s", _null_rows())
    assert _dirs(tmp_path / "s") == {
        "transfers/day=__HIVE_DEFAULT_PARTITION__/engine_id=__HIVE_DEFAULT_PARTITION__",
        "transfers/day=__HIVE_DEFAULT_PARTITION__/engine_id=%4Eone",
        "transfers/day=2026-09-21/engine_id=d0",
    }
    assert [r[:2] for r in _rows(tmp_path / "s")] == [("a", None), ("b", "None"), ("c", "d0")]
    # the one string that would read as Hive's null is quoted apart
    assert commit._partition_dir("__HIVE_DEFAULT_PARTITION__") == "%5F_HIVE_DEFAULT_PARTITION__"
    assert commit._partition_dir(None) == "__HIVE_DEFAULT_PARTITION__"
    # a Hive-partitioned reader reads the null back as null
    import duckdb

    glob = f"{tmp_path / 's'}/transfers/*/*/*.parquet"
    hive = duckdb.sql(
        f"SELECT request_id, engine_id FROM read_parquet('{glob}', hive_partitioning = true, "
        "hive_types_autocast = false) ORDER BY request_id"
    ).fetchall()
    assert hive == [("a", None), ("b", "None"), ("c", "d0")]


@pytest.fixture
def old_store(tmp_path, monkeypatch) -> Path:
    """A store written the old way: a null partition value in a directory named "None"."""
    root = tmp_path / "old"
    with monkeypatch.context() as patch:
        patch.setattr(commit, "_partition_dir", lambda value: quote(str(value), safe=""))
        _write(root, _null_rows())
        more = _null_rows().slice(2).set_column(1, "request_id", pa.array(["d"]))
        _write(root, more)  # a batch with no null partition: it is not rewritten
    assert _dirs(root) == {"transfers/day=None/engine_id=None", "transfers/day=2026-09-21/engine_id=d0"}
    return root


def test_old_none_partitions_are_migrated_in_place(old_store, monkeypatch):
    before = _rows(old_store)
    reader = Store(old_store).connect(with_queries=False)  # listed the old files
    with Store(old_store).writer_lock():
        assert Store(old_store).migrate() == 1
    assert _rows(old_store) == before
    committed = Store(old_store).committed_files("transfers")
    assert not any(commit.legacy_partition(f) for f in committed)
    assert {f.rsplit("/", 1)[0] for f in committed} == {
        "transfers/day=__HIVE_DEFAULT_PARTITION__/engine_id=__HIVE_DEFAULT_PARTITION__",
        "transfers/day=__HIVE_DEFAULT_PARTITION__/engine_id=%4Eone",
        "transfers/day=2026-09-21/engine_id=d0",
    }
    # the old files stay for readers that listed them, within the grace hour
    assert reader.sql("SELECT count(*) FROM transfers").fetchall() == [(4,)]
    assert "transfers/day=None/engine_id=None" in _dirs(old_store)
    monkeypatch.setattr(commit, "COMPACT_GRACE_S", 0.0)  # an hour later
    with Store(old_store).writer_lock():
        Store(old_store).recover()
    assert _rows(old_store) == before
    assert "transfers/day=None/engine_id=None" not in _dirs(old_store)


def test_a_writer_migrates_and_a_later_batch_is_deduped_against_old_names(old_store):
    from hybridtrace.store.keys import dedupe

    before = _rows(old_store)
    kept, dropped = dedupe(Store(old_store), "transfers", _null_rows())  # the same rows again
    assert (kept.num_rows, dropped) == (0, 3)  # found under the old names
    (old_store.parent / "empty").mkdir()
    ingest([old_store.parent / "empty"], old_store)  # a writer's recovery migrates
    assert not any(commit.legacy_partition(f) for f in Store(old_store).committed_files("transfers"))
    assert _rows(old_store) == before


@pytest.mark.parametrize("crash_at", ["before the commit", "after the commit"])
def test_a_killed_migration_leaves_every_row_once(old_store, monkeypatch, crash_at):
    monkeypatch.setattr(commit, "COMPACT_GRACE_S", 0.0)  # old files go at once: the deletions die
    before = _rows(old_store)
    store = Store(old_store)
    revive = kill_writes(monkeypatch, store, crash_at)
    with pytest.raises(OSError), store.writer_lock():
        store.migrate()
        store.recover()
    assert _rows(old_store) == before  # readable, every row once
    revive()
    with store.writer_lock():
        store.recover()  # clears what the cut migration left, and finishes it
    assert _rows(old_store) == before
    assert not any(commit.legacy_partition(f) for f in store.committed_files("transfers"))


# --- Iceberg -------------------------------------------------------------------------------


def test_a_store_that_does_not_opt_in_has_no_iceberg(tmp_path):
    ingest([_bundle(tmp_path, 1, "b")], tmp_path / "store")
    assert not (tmp_path / "store" / "_iceberg").exists()
    assert "pyiceberg" not in sys.modules or not Store(tmp_path / "store").publishes_iceberg


@needs_iceberg
def test_iceberg_counts_exactly_the_committed_rows_after_ingest(tmp_path):
    root = _enabled_store(tmp_path)
    ingest([_bundle(tmp_path, 1, "b")], root)
    want = assert_exact(root)
    assert folder_counts(root) == want  # nothing uncommitted or superseded yet
    # the schema maps: types, every column optional, partitions by the files' own columns
    from hybridtrace.store import iceberg

    with iceberg.catalog(Store(root), write=False) as ice:
        table = ice.load_table(("hybridtrace", "transfers"))
        schema = table.schema()
        assert [f.name for f in schema.fields] == table_schema("transfers").column_names
        assert not any(f.required for f in schema.fields)
        assert str(schema.find_field("ts").field_type) == "double"
        assert [f.name for f in table.spec().fields] == ["day", "engine_id"]
        days = table.scan(row_filter="engine_id IS NOT NULL").to_arrow()["day"]
        assert days.null_count == 0
    assert (root / "_iceberg" / "tables.json").exists()


def _compacted(tmp_path: Path, monkeypatch) -> tuple[Path, dict[str, int]]:
    """A store of one batch an object, exact, then compacted; (its root, the counts before)."""
    root = _enabled_store(tmp_path)
    monkeypatch.setattr(ingest_run, "BATCH_OBJECTS", 1)
    monkeypatch.setattr(commit, "COMPACT_MIN_BATCHES", 1_000)
    ingest([_bundle(tmp_path, 1, "b")], root)
    before = assert_exact(root)
    with Store(root).writer_lock():
        assert Store(root).compact(min_batches=2) > 1
    return root, before


@needs_iceberg
def test_iceberg_right_after_a_compaction(tmp_path, monkeypatch):
    root, before = _compacted(tmp_path, monkeypatch)
    assert view_counts(root) == before
    assert assert_exact(root) == before
    # the superseded files are still there, and a plain reader counts them twice
    plain = folder_counts(root)
    assert plain["transfers"] > before["transfers"] and plain["sources"] > before["sources"]


@needs_iceberg
def test_iceberg_commits_check_one_manifest_at_a_time(tmp_path, monkeypatch):
    """pyiceberg checks an overwrite's manifests on a thread pool with one evaluator object,
    which holds the manifest under evaluation as an attribute: two checks at once can judge a
    manifest by the other's partition bounds, skip one that holds a file to delete, and fail
    the commit ("Missing required files to delete", seen under load after a compaction). Each
    check here lasts a few milliseconds; none of the mirror's may overlap another."""
    import threading

    from pyiceberg.expressions import visitors

    plain = visitors._ManifestEvalVisitor.eval
    guard, running, most = threading.Lock(), [0], [0]

    def timed_eval(self, manifest):
        with guard:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            time.sleep(0.003)
            return plain(self, manifest)
        finally:
            with guard:
                running[0] -= 1

    monkeypatch.setattr(visitors._ManifestEvalVisitor, "eval", timed_eval)
    root, before = _compacted(tmp_path, monkeypatch)
    assert assert_exact(root) == before
    assert most[0] == 1


@needs_iceberg
def test_iceberg_after_an_ingest_killed_before_its_commit(tmp_path):
    root = _enabled_store(tmp_path)
    ingest([_bundle(tmp_path, 1, "b")], root)
    second = _bundle(tmp_path, 2, "c")
    done = subprocess.run([sys.executable, "-c", KILLED_INGEST, str(second), str(root)], capture_output=True)
    assert done.returncode == -9
    want = assert_exact(root)
    assert folder_counts(root)["transfers"] > want["transfers"]  # the killed batch's files
    ingest([second], root)  # the next run recovers, reads the objects again and commits
    after = assert_exact(root)
    assert after["transfers"] > want["transfers"] and folder_counts(root) == after


@needs_iceberg
def test_iceberg_repaired_after_a_run_killed_between_the_two_commits(tmp_path, monkeypatch):
    root = _enabled_store(tmp_path)
    ingest([_bundle(tmp_path, 1, "b")], root)

    publish, calls = Store.publish, []

    def killed(self):  # the run's recovery publishes; it dies at the publish after its commit
        calls.append(1)
        if len(calls) > 1:
            raise OSError("killed")
        publish(self)

    with monkeypatch.context() as patch:
        patch.setattr(Store, "publish", killed)
        with pytest.raises(StoreWriteError, match="killed"):
            ingest([_bundle(tmp_path, 2, "c")], root)
    assert iceberg_counts(root) != view_counts(root)  # Iceberg fell behind the store's commit
    ingest([tmp_path / "c"], root)  # the next writer's recovery brings it up to date
    assert assert_exact(root) == view_counts(root)


@needs_iceberg
def test_the_iceberg_command_turns_it_on(tmp_path):
    from typer.testing import CliRunner

    from hybridtrace.cli import app

    ingest([_bundle(tmp_path, 1, "b")], tmp_path / "store")
    done = CliRunner().invoke(app, ["iceberg", "--store", str(tmp_path / "store"), "--format", "json"])
    assert done.exit_code == 0, done.output
    rows = {r["table"]: r for r in __import__("json").loads(done.output)}
    assert rows["transfers"]["files"] >= 1 and rows["transfers"]["metadata"].endswith(".metadata.json")
    assert Store(tmp_path / "store").publishes_iceberg
    assert_exact(tmp_path / "store")


@needs_iceberg
def test_an_iceberg_store_refuses_a_writer_without_pyiceberg(tmp_path, monkeypatch):
    from hybridtrace.errors import UsageError
    from hybridtrace.store import iceberg

    root = _enabled_store(tmp_path)
    monkeypatch.setattr(iceberg, "available", lambda: False)
    with pytest.raises(UsageError, match="hybridtrace\\[iceberg\\]"):
        ingest([_bundle(tmp_path, 1, "b")], root)
    assert not Store(root).committed_batches()


def test_the_ci_spark_tier_runs_the_external_read_tests():
    ci = (Path(__file__).parents[1] / ".ci" / "run").read_text()
    assert "tests/test_iceberg_spark.py" in ci and "iceberg" in ci
    assert os.path.exists(Path(__file__).with_name("test_iceberg_spark.py"))


# --- a store in a bucket (the loopback S3 server) ------------------------------------------

KILLED_BUCKET_INGEST = KILLED_INGEST.replace("roots.LocalRoot", "roots.BucketRoot")


def _bucket_snapshot_counts(uri: str) -> dict[str, int]:
    """Rows of the files each Iceberg table's snapshot lists, read from the bucket by pyarrow."""
    import pyarrow.parquet as pq

    from hybridtrace.store import iceberg

    store = Store(uri)
    fs = store.files.fs
    out = {}
    for table in TABLES:
        files = iceberg.snapshot_files(store, table)
        assert all(f.startswith("s3://telemetry/store/") for f in files)
        out[table] = sum(pq.read_metadata(f.removeprefix("s3://"), filesystem=fs).num_rows for f in files)
    return out


def _bucket_folder_counts(uri: str) -> dict[str, int]:
    import pyarrow.parquet as pq

    store = Store(uri)
    def rows(rel: str) -> int:
        return pq.read_metadata(store.files.full(rel), filesystem=store.files.fs).num_rows

    return {t: sum(rows(f) for f in store._files(t)) for t in TABLES}


@needs_iceberg
@pytest.mark.servers
def test_a_bucket_store_publishes_its_catalog_in_the_bucket(tmp_path, monkeypatch):
    import servers

    from hybridtrace.store import iceberg

    if os.environ.get("HYBRIDTRACE_REQUIRE_SERVERS") != "1":
        pytest.importorskip("moto.server")
    for name, value in {"HYBRIDTRACE_LEASE_SETTLE_S": "0.3", "HYBRIDTRACE_LEASE_S": "3"}.items():
        monkeypatch.setenv(name, value)  # a killed run's lease is gone in seconds
    with servers.moto_s3() as srv:
        for name, value in srv.env.items():
            monkeypatch.setenv(name, value)
        srv.make_bucket("telemetry")
        uri = "s3://telemetry/store"
        iceberg.enable(Store(uri))
        monkeypatch.setattr(ingest_run, "BATCH_OBJECTS", 1)
        monkeypatch.setattr(commit, "COMPACT_MIN_BATCHES", 1_000)
        ingest([_bundle(tmp_path, 1, "b")], uri)
        want = view_counts(uri)
        assert sum(want.values()) and iceberg_counts(uri) == want == _bucket_snapshot_counts(uri)
        assert all(Store(uri).files.exists(f"_iceberg/{name}") for name in ("catalog.db", "tables.json"))
        with Store(uri).writer_lock():
            assert Store(uri).compact(min_batches=2) > 1
        assert iceberg_counts(uri) == want == _bucket_snapshot_counts(uri)
        assert _bucket_folder_counts(uri)["transfers"] > want["transfers"]  # superseded, still there
        second = _bundle(tmp_path, 2, "c")
        killed = [sys.executable, "-c", KILLED_BUCKET_INGEST, str(second), uri]
        assert subprocess.run(killed, capture_output=True).returncode == -9
        assert iceberg_counts(uri) == view_counts(uri) == want == _bucket_snapshot_counts(uri)
        for _ in range(60):  # the killed run's lease expires in seconds (fast leases)
            try:
                ingest([second], uri)
                break
            except UsageError as held:
                assert "another ingest" in str(held)
                time.sleep(0.5)
        after = view_counts(uri)
        assert after["transfers"] > want["transfers"]
        assert iceberg_counts(uri) == after == _bucket_snapshot_counts(uri)
