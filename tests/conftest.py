"""Fixtures shared by the test files, and the tiers the default run leaves out.

The default ``python -m pytest -q`` deselects the slower tiers (pyproject.toml's
``addopts``); each runs by name, as .ci/run does:

- ``-m browser``: the report in a real headless Chromium (HYBRIDTRACE_REQUIRE_BROWSER=1
  makes a missing browser a failure, not a skip);
- ``-m servers``: bucket tests against moto's S3 API and the GCS emulator on loopback
  (HYBRIDTRACE_REQUIRE_SERVERS=1 likewise);
- ``-m "slow and not servers"``: processes killed at random points, 48 MiB values,
  100,000-request bundles (a slow test that also needs a server runs with the servers);
- ``-m ""``: everything above and the default run at once.

The connector tier (tests/connector/) has its own conftest and venv.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import servers

from hybridtrace.ingest.run import ingest
from hybridtrace.simulate import SimOptions, parse_inject, simulate

# the Spark tier's bucket server and session (module-scoped, one pair per Spark test file)
pytest_plugins = ["sparkfixtures"]

# The demo's injections (hybridtrace.demo) on a shorter stretch of traffic: a slow decode
# rank, some padded state, a few failed and expired reads.
DEMO_INJECT = "slow_rank,padding_leak=0.1,transfer_failed=0.02,kv_expired=0.02"


@pytest.fixture(scope="session")
def demo_bundle(tmp_path_factory) -> Path:
    """A simulated bundle like the demo's, made once per run. Read it; never write into it."""
    root = tmp_path_factory.mktemp("demo") / "bundle"
    simulate(SimOptions(seed=3, duration_s=40, inject=parse_inject(DEMO_INJECT)), root)
    return root


@pytest.fixture(scope="session")
def demo_store(demo_bundle: Path) -> Path:
    """``demo_bundle`` ingested once per run. Tests that only read a store share it; a test
    that ingests, compacts or deletes makes its own."""
    store = demo_bundle.parent / "store"
    ingest([demo_bundle], store)
    return store


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory):
    """The Spark Connect server PySpark ships, on loopback with local[2], started once for the
    Spark tier's ingest and analysis tests (stopped after). It reads local paths only: its
    environment is the one the session had when it started."""
    if importlib.util.find_spec("pyspark") is None or shutil.which("java") is None:
        if os.environ.get("HYBRIDTRACE_REQUIRE_SPARK") == "1":
            pytest.fail("the spark tier needs PySpark and Java (pip install '.[spark]')")
        pytest.skip("the spark tier needs PySpark and Java (pip install '.[spark]')")
    import pyspark

    home = Path(pyspark.__file__).parent
    port = servers.free_port()
    logs = tmp_path_factory.mktemp("connect")
    env = {**os.environ, "SPARK_HOME": str(home), "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOG_DIR": str(logs), "SPARK_PID_DIR": str(logs)}  # fmt: skip
    settings = ["spark.connect.grpc.binding.address=127.0.0.1", f"spark.connect.grpc.binding.port={port}",
                "spark.driver.bindAddress=127.0.0.1", "spark.driver.host=127.0.0.1"]  # fmt: skip
    command = [str(home / "sbin" / "start-connect-server.sh"), "--master", "local[2]"]
    for setting in settings:
        command += ["--conf", setting]
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=120)
    try:
        deadline = time.monotonic() + 120
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "the Spark Connect server did not start in 120 s"
            time.sleep(1)
        yield f"sc://127.0.0.1:{port}"
    finally:
        stop = home / "sbin" / "stop-connect-server.sh"
        subprocess.run([str(stop)], env=env, capture_output=True, timeout=120)
