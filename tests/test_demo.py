"""`hybridtrace demo`, the README's main command, as a new user runs it."""

import subprocess
import sys
from pathlib import Path

from hybridtrace.store import Store

SCRIPT = Path(sys.executable).with_name("hybridtrace")


def test_demo_end_to_end(tmp_path):
    command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "hybridtrace"]
    result = subprocess.run(
        [*command, "demo", "--dir", str(tmp_path / "d")], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for heading in ("Effective bandwidth per decode rank", "What the logs said", "injected on purpose"):
        assert heading in out
    assert str(tmp_path / "d" / "store") in out
    # it ends with the report's path
    report = tmp_path / "d" / "report.html"
    assert out.rstrip().splitlines()[-1].split()[:2] == ["report", str(report)]
    assert report.stat().st_size > 100_000 and "hybridtrace report" in report.read_text()
    con = Store(tmp_path / "d" / "store").connect()
    # the injected slow rank stands out: the last decode rank reads well below its peer
    rates = dict(con.sql("SELECT rank, effective_gb_s FROM rank_bandwidth").fetchall())
    assert rates[1] < 0.6 * rates[0]
    assert (tmp_path / "d" / "bundle" / "truth.json").exists()
