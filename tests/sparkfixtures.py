"""The Spark tier's fixtures: a loopback S3 server and a ``local[2]`` SparkSession per module.

Registered for every test file by ``conftest.py`` (``pytest_plugins``). Both are module
scoped: each Spark test file gets its own server, started before its own session, so the
executors' settings name that server.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator

import pytest
import servers

REQUIRE = os.environ.get("HYBRIDTRACE_REQUIRE_SPARK") == "1"


def have_spark() -> bool:
    return importlib.util.find_spec("pyspark") is not None and shutil.which("java") is not None


@pytest.fixture(scope="module")
def spark_s3() -> Iterator[servers.Server]:
    """The loopback S3 server, started before Spark so its executors' environment has it."""
    if not REQUIRE:
        pytest.importorskip("moto.server")
        if not have_spark():
            pytest.skip("the spark tier needs PySpark and Java (pip install '.[spark]')")
    with servers.moto_s3() as srv, pytest.MonkeyPatch.context() as patch:
        for name, value in srv.env.items():
            patch.setenv(name, value)
        srv.make_bucket("telemetry")
        yield srv


@pytest.fixture(scope="module")
def spark(spark_s3):
    from hybridtrace.spark.session import open_session, spark_options

    # the bucket's settings for the executors as spark.executorEnv: an earlier module's JVM,
    # still running in this process, holds the environment of that module's server
    executors = {f"spark.executorEnv.{k}": v for k, v in spark_s3.env.items()}
    session = open_session(
        spark_options(master="local[2]", conf={"spark.sql.shuffle.partitions": 2, **executors})
    )
    yield session
    session.stop()
