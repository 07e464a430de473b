"""The link fits a store's opening computes (``refresh_link_fits``), timed on one connection.

    python benchmarks/link_fits.py STORE [--runs 7]

Opens STORE for analysis once (which fits once: not timed), then refits ``--runs`` times on
the same connection and prints each run, the median and the fastest. The fits read the
store and write only the connection's own table, so any store will do, a read-only one
too. On a shared machine the runs vary by tens of percent: compare medians and minima of
runs made in one session.
"""

from __future__ import annotations

import argparse
import statistics
import time

from hybridtrace.analyze.link_fit import refresh_link_fits
from hybridtrace.store.analysis import open_analysis


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    con = open_analysis(args.store)
    seconds = []
    for _ in range(args.runs):
        start = time.perf_counter()
        fits = refresh_link_fits(con)
        seconds.append(time.perf_counter() - start)
    print(f"{fits} fits; runs: " + " ".join(f"{s:.3f}" for s in seconds))
    print(f"median {statistics.median(seconds):.3f} s, fastest {min(seconds):.3f} s")


if __name__ == "__main__":
    main()
