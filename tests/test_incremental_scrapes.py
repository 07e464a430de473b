"""Incremental analysis of Prometheus scrapes: each run computes the scrapes its new samples
make or change, and after every step (new scrapes, a late one inside a day already analysed, a
gap of days, a restart, new series, a scrape read in two slices, a new instance, a compaction)
the kept intervals equal those computed from every sample, and the analysis a full one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hybridtrace.analyze import analyze
from hybridtrace.ingest.run import ingest
from hybridtrace.simulate import SimOptions, simulate
from hybridtrace.store import Store

T0 = 1_776_729_600  # 2026-04-21T00:00:00Z
HOUR = 3600


@pytest.fixture(scope="module")
def sim(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sim") / "b"
    simulate(SimOptions(seed=53, duration_s=240, inject={"padding_leak": 0.3}), str(out))
    return out


@pytest.fixture(scope="module")
def scrapes(sim) -> list[str]:
    """The simulated decode engine's cumulative scrapes, in order (some of its reads padded)."""
    found = [p.read_text() for p in sorted((sim / "decode-0").glob("metrics-*.prom"))]
    assert len(found) >= 14
    return found


class Scrapes:
    """A bucket receiving one engine's scrapes, a file each, named by their time, beside its
    log (which names the engine the byte model sizes; no trace: the native rules judge it)."""

    def __init__(self, root: Path, sim: Path) -> None:
        self.input, self.store = root / "in", root / "store"
        (self.input / "decode-0").mkdir(parents=True)
        for log in (sim / "decode-0").glob("vllm.log*"):
            shutil.copy(log, self.input / "decode-0" / log.name)
        shutil.copytree(sim / "models", self.input / "models")

    def put(self, ts: float, text: str, folder: str = "decode-0") -> None:
        path = self.input / folder / f"metrics-{int(ts * 1000)}.prom"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def ingest(self) -> None:
        ingest([str(self.input)], str(self.store), progress=False, model="nemotron-nano-12b-v2")

    def check(self) -> dict:
        """An incremental run equals a full analysis; then a run with nothing new reads every
        scrape's interval from the state alone, and those equal the view over every sample.
        Returns the incremental run's row of analysis_runs."""
        incremental = analyze(Store(self.store).connect(), incremental=True)
        whole = analyze(Store(self.store).connect())
        assert _text(incremental) == _text(whole)
        con = Store(self.store).connect()
        run = con.sql("SELECT * FROM analysis_runs ORDER BY seq DESC LIMIT 1")
        last = dict(zip([c[0] for c in run.description], run.fetchall()[0], strict=True))
        analyze(con, incremental=True)  # nothing new: answered from the state
        columns = ", ".join(con.sql("SELECT * FROM _prom_scrape_intervals LIMIT 0").columns)
        kept = con.sql(f"SELECT {columns} FROM _merged_scrapes").fetchall()
        every = con.sql(f"SELECT {columns} FROM _prom_scrape_intervals").fetchall()
        assert sorted(map(repr, kept)) == sorted(map(repr, every))
        assert every
        return last


def _text(result) -> str:
    return json.dumps(result.as_dict(), sort_keys=True, default=str)


def _stamped(text: str, ts: float) -> str:
    """A scrape's lines with the sample time on each (a dump of several scrapes in one file)."""
    return "".join(
        f"{line} {int(ts * 1000)}\n" if line and not line.startswith("#") else f"{line}\n"
        for line in text.splitlines()
    )


def test_kept_scrape_intervals_equal_every_samples_after_each_step(sim, scrapes, tmp_path):
    job = Scrapes(tmp_path, sim)
    at = {k: T0 + k * 5 * HOUR for k in range(8)}
    # 1. four scrapes of the first day, the third held back: the first run computes them all
    for k in (0, 1, 3, 4):
        job.put(at[k], scrapes[k])
    job.ingest()
    first = job.check()
    assert first["full_run"] and first["scrapes"] == 3  # a series' first scrape has no interval
    kinds = analyze(Store(job.store).connect()).summary["findings_by_kind"]
    assert kinds["padding_leak"] > 0  # the native rules judge these intervals
    # 2. two scrapes after every one seen: those two only
    job.put(at[5], scrapes[5])
    job.put(at[6], scrapes[6])
    job.ingest()
    assert job.check()["scrapes"] == 2
    # 3. the held-back scrape arrives late, inside the first day's span: it, and the scrape after
    # it (whose samples had the one before as predecessors)
    job.put(at[2], scrapes[2])
    job.ingest()
    late = job.check()
    assert not late["full_run"] and late["scrapes"] == 2
    # 4. three days of silence: the predecessors come from the days before the window
    resumed = at[6] + 3 * 24 * HOUR
    job.put(resumed, scrapes[7])
    job.ingest()
    assert job.check()["scrapes"] == 1
    # 5. the engine restarts: its counters begin again (a reset), twice in one batch
    job.put(resumed + HOUR, scrapes[0])
    job.put(resumed + 2 * HOUR, scrapes[1])
    job.ingest()
    assert job.check()["scrapes"] == 2
    # 6. a second engine index shows up in the same scrapes: new series without a predecessor
    for n, (zero, one) in enumerate([(scrapes[2], scrapes[8]), (scrapes[3], scrapes[9])]):
        job.put(resumed + (3 + n) * HOUR, zero + one.replace('engine="0"', 'engine="1"'))
    job.ingest()
    assert job.check()["scrapes"] == 3  # engine 0 twice; engine 1 once (its first has none)
    # 7. a dump of stamped scrapes read while it was being written: one scrape in two slices
    dump = job.input / "decode-0" / "dump.prom"
    t10, t11, t12 = (resumed + h * HOUR for h in (6, 7, 8))
    whole = _stamped(scrapes[10], t10) + _stamped(scrapes[11], t11)
    cut = len(_stamped(scrapes[10], t10)) + len(_stamped(scrapes[11], t11)) // 2
    cut = whole.rindex("\n", 0, cut) + 1
    dump.write_text(whole[:cut])
    job.ingest()
    job.check()
    dump.write_text(whole + _stamped(scrapes[12], t12))
    job.ingest()
    assert job.check()["scrapes"] == 2  # the scrape cut in two, and the one after it
    # 8. a new instance, then a compaction of data and state: nothing to compute again
    job.put(resumed + 9 * HOUR, scrapes[0], folder="decode-1")
    job.put(resumed + 10 * HOUR, scrapes[1], folder="decode-1")
    job.ingest()
    assert job.check()["scrapes"] == 1
    assert Store(job.store).compact(min_batches=2) >= 2
    job.check()
    job.put(resumed + 11 * HOUR, scrapes[13])
    job.ingest()
    assert job.check()["scrapes"] == 1


def test_a_run_without_new_samples_computes_no_scrape(sim, scrapes, tmp_path):
    job = Scrapes(tmp_path, sim)
    for k in range(4):
        job.put(T0 + k * 15, scrapes[k])
    job.ingest()
    assert job.check()["scrapes"] == 3
    (job.input / "decode-0" / "other.log").write_text(  # a batch with no sample
        "(EngineCore_DP0 pid=1) INFO 04-21 00:01:00 [core.py:90] Initializing a V1 LLM engine\n"
    )
    job.ingest()
    assert job.check()["scrapes"] == 0


def test_new_reads_too_many_to_spell_out_are_read_from_their_table(sim, scrapes, tmp_path, monkeypatch):
    # Past a few thousand new reads, the run names them by a subquery instead of a list: the
    # late scrape, which reads the samples earlier runs saw, comes out the same.
    from functools import partial

    from hybridtrace.analyze import incremental

    monkeypatch.setattr(incremental, "_listed", partial(incremental._listed, limit=0))
    job = Scrapes(tmp_path, sim)
    at = {k: T0 + k * 5 * HOUR for k in range(5)}
    for k in (0, 1, 3, 4):
        job.put(at[k], scrapes[k])
    job.ingest()
    job.check()
    job.put(at[2], scrapes[2])
    job.ingest()
    assert job.check()["scrapes"] == 2
