"""The HTML report opened in a real headless Chromium, offline: every chart draws, no errors.

Needs Debian's ``chromium`` (``.ci/run`` installs it) and the ``playwright`` package
(the test extra), which drives that browser; no browser is downloaded. Where Chromium is
missing the test skips, unless HYBRIDTRACE_REQUIRE_BROWSER=1 (set by CI) makes that a
failure. The screenshot is kept in ``tests/artifacts/``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from hybridtrace.report import write_report
from hybridtrace.simulate import SimOptions, parse_inject, simulate

pytestmark = pytest.mark.browser

ARTIFACTS = Path(__file__).parent / "artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Flags that keep Chromium from reaching for the network on its own (updates, sync, ...)
# and let it run as root in a container.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        if os.environ.get("HYBRIDTRACE_REQUIRE_BROWSER") == "1":
            pytest.fail("chromium is not installed, and this run requires the browser test")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    from hybridtrace.ingest.run import ingest

    root = tmp_path_factory.mktemp("report")
    inject = parse_inject(
        "slow_rank,padding_leak=0.1,transfer_failed=0.02,kv_expired=0.02,descriptor_bound=0.05"
    )
    # two decode engines, so the per-engine panels (faceted charts) are drawn too
    simulate(SimOptions(seed=7, duration_s=60, decode_engines=2, inject=inject), root / "bundle")
    ingest([root / "bundle"], root / "store")
    path, _ = write_report(root / "store", root / "report.html")
    return path


def test_every_chart_renders_offline_without_errors(browser, report):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, offline=True)
    page = context.new_page()
    errors: list[str] = []
    requests: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: requests.append(r.url) if not r.url.startswith(("file:", "data:")) else None)
    page.goto(report.as_uri())
    boxes = page.locator("div.chart[data-spec]")
    count = boxes.count()
    assert count >= 6, "the demo-like store has data for every chart"
    page.wait_for_function(
        "n => document.querySelectorAll('div.chart[data-rendered=yes]').length === n",
        arg=count,
        timeout=30_000,
    )
    for i in range(count):
        box = boxes.nth(i)
        drawn = box.locator("svg, canvas")
        assert drawn.count() >= 1, f"chart {box.get_attribute('id')} drew nothing"
        assert box.locator("svg .mark-symbol, svg .mark-rect, svg .mark-line, svg .mark-rule").count() > 0
    assert errors == []
    assert requests == [], "the page asked the network for something"
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
    # A docs link opens the kind's page inside the report.
    page.locator("#summary a[href='#doc-padding_leak']").first.click()
    assert page.locator("details#doc-padding_leak").get_attribute("open") is not None
    context.close()


def test_findings_table_sorts_by_a_clicked_heading(browser, report):
    context = browser.new_context(offline=True)
    page = context.new_page()
    page.goto(report.as_uri())
    ranks = page.locator("#findings-table tbody tr td:nth-child(4)")
    page.locator("#findings-table th", has_text="kind").click()
    kinds = page.locator("#findings-table tbody tr td:nth-child(2)").all_text_contents()
    assert kinds == sorted(kinds)
    page.locator("#findings-table th", has_text="kind").click()
    again = page.locator("#findings-table tbody tr td:nth-child(2)").all_text_contents()
    assert again == sorted(kinds, reverse=True)
    assert ranks.count() == len(kinds)
    context.close()
