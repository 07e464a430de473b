"""The external read on Spark: PySpark on ``local[2]`` reads the files each Iceberg table's
current snapshot lists, and counts exactly the rows hybridtrace's views count — after an
ingest, right after a compaction (the superseded files still on disk) and after an ingest
killed before its commit; a plain read of the table folders over-counts in the last two.

The Iceberg Spark runtime jar comes from Maven, which this project's CI cannot reach, so
Spark reads the snapshot's file list here rather than through an Iceberg catalog
(``docs/iceberg.md`` gives the catalog configuration). Runs in the CI spark tier.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest
from test_iceberg import KILLED_INGEST, _bundle, _enabled_store, assert_exact, view_counts

import hybridtrace.ingest.run as ingest_run
import hybridtrace.store.commit as commit
from hybridtrace.ingest.run import ingest
from hybridtrace.schema import TABLES
from hybridtrace.store import Store

pytestmark = pytest.mark.spark
REQUIRE = os.environ.get("HYBRIDTRACE_REQUIRE_SPARK") == "1"


@pytest.fixture(scope="module")
def spark():
    have = all(importlib.util.find_spec(m) is not None for m in ("pyspark", "pyiceberg"))
    if not REQUIRE and not (have and shutil.which("java")):
        pytest.skip("needs PySpark, pyiceberg and Java (pip install '.[spark,iceberg]')")
    from hybridtrace.spark.session import open_session, spark_options

    session = open_session(spark_options(master="local[2]", conf={"spark.sql.shuffle.partitions": 2}))
    yield session
    session.stop()


def spark_counts(spark, root) -> dict[str, int]:
    """Rows of each table's current Iceberg snapshot files, read by Spark."""
    from hybridtrace.store import iceberg

    out = {}
    for table in TABLES:
        files = iceberg.snapshot_files(Store(root), table)
        out[table] = spark.read.parquet(*files).count() if files else 0
    return out


def spark_folder_counts(spark, root) -> dict[str, int]:
    """What Spark counts reading the table folders plainly (Hive partition discovery)."""
    out = {}
    for table in TABLES:
        if not list((root / table).rglob("part-*.parquet")):
            out[table] = 0
            continue
        # (the filter keeps out sources/supersedes-*.json, which Spark would try to read as Parquet)
        read = spark.read.option("basePath", str(root / table)).option("pathGlobFilter", "*.parquet")
        out[table] = read.parquet(str(root / table)).count()
    return out


def test_spark_reads_exactly_the_committed_rows(spark, tmp_path, monkeypatch):
    root = _enabled_store(tmp_path)
    monkeypatch.setattr(ingest_run, "BATCH_OBJECTS", 1)  # many batches, for the compaction
    monkeypatch.setattr(commit, "COMPACT_MIN_BATCHES", 1_000)
    ingest([_bundle(tmp_path, 1, "b")], root)
    want = assert_exact(root)
    assert spark_counts(spark, root) == want == spark_folder_counts(spark, root)

    with Store(root).writer_lock():
        assert Store(root).compact(min_batches=2) > 1
    assert view_counts(root) == want
    assert spark_counts(spark, root) == want
    plain = spark_folder_counts(spark, root)
    assert plain["transfers"] > want["transfers"]  # the superseded files, counted again

    monkeypatch.setattr(commit, "COMPACT_GRACE_S", 0.0)  # an hour later: they go
    with Store(root).writer_lock():
        Store(root).recover()
    second = _bundle(tmp_path, 2, "c")
    done = subprocess.run([sys.executable, "-c", KILLED_INGEST, str(second), str(root)], capture_output=True)
    assert done.returncode == -9
    assert spark_counts(spark, root) == assert_exact(root) == want
    assert spark_folder_counts(spark, root)["transfers"] > want["transfers"]  # the killed batch's files
