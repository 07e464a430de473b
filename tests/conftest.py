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

from pathlib import Path

import pytest

from hybridtrace.ingest.run import ingest
from hybridtrace.simulate import SimOptions, parse_inject, simulate

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
