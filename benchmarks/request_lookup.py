"""A look-up of a few requests' reads in a store whose request ids are random, as vLLM's are.

    python benchmarks/request_lookup.py [--requests 250000,1000000] [--dir /tmp/hybridtrace-lookup-bench]

An incremental analysis reads the rows of the requests new objects touch (its cut, in
``analyze/incremental.py``): ``request_id IN (...)`` over every file of the store. The
simulator numbers its requests in order, so there a file's row-group statistics skip all
but the newest groups; vLLM's ids are random, every group spans the whole range of ids, and
statistics skip nothing. For each store size this writes the reads of N requests (TP 4: four
reads each, in batches of 50,000 requests, one file each) twice, with the store's writer
(``write_parquet_table``: Bloom filters of the request ids) and with the same options
without the filters, plus a new object of 20 requests; then times, best of five, the cut of
the 20 new requests and their 20 prefill ids (40 ids no old file holds), and of 40 old
requests spread over the store. Prints each time and the ratio without / with the filters:
the cut of new requests should stay flat as the store grows (its cost follows the new data),
and the cut of old requests reads their groups either way.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from hybridtrace.store.roots import BLOOM_WRITTEN, PARQUET_OPTIONS, dictionary_columns, write_parquet_table

BATCH = 50_000  # requests per file
TP = 4


def _ids(start: int, n: int, salt: str) -> list[str]:
    return [f"cmpl-{hashlib.md5(f'{salt}{i}'.encode()).hexdigest()}-0" for i in range(start, start + n)]


def _reads(ids: list[str], t0: float) -> pa.Table:
    """TP reads of each request, with the columns a trace's reads carry most of their bytes in."""
    n = len(ids) * TP
    repeated = [i for i in ids for _ in range(TP)]
    return pa.table(
        {
            "ts": pa.array([t0 + k * 0.0005 for k in range(n)], pa.float64()),
            "request_id": repeated,
            "remote_request_id": [i.replace("cmpl-", "cmpl-p") for i in repeated],
            "engine_id": ["decode-0"] * n,
            "remote_engine_id": ["prefill-0"] * n,
            "rank": pa.array([k % TP for k in range(n)], pa.int32()),
            "status": ["ok"] * n,
            "xfer_s": pa.array([0.01 + (k % 97) * 1e-4 for k in range(n)], pa.float64()),
            "transported_bytes": pa.array([1_000_000 + (k % 8191) * 64 for k in range(n)], pa.int64()),
        }
    )


def _write_plain(table: pa.Table, path: str) -> None:
    pq.write_table(table, path, use_dictionary=dictionary_columns(table), **PARQUET_OPTIONS)


def _best(con: duckdb.DuckDBPyConnection, sql: str, repeat: int = 5) -> tuple[float, int]:
    best, rows = float("inf"), 0
    for _ in range(repeat):
        started = time.perf_counter()
        rows = len(con.execute(sql).fetchall())
        best = min(best, time.perf_counter() - started)
    return best, rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", default="250000,1000000", help="store sizes, comma-separated")
    parser.add_argument("--dir", default="/tmp/hybridtrace-lookup-bench")
    args = parser.parse_args()
    if not BLOOM_WRITTEN:
        raise SystemExit("this pyarrow writes no Bloom filters: nothing to compare")
    root = Path(args.dir)
    con = duckdb.connect()
    print(f"{'store':>10}  {'cut':<26} {'no filters':>10} {'filters':>9} {'ratio':>6}  rows")
    for size in (int(s) for s in args.requests.split(",")):
        shutil.rmtree(root, ignore_errors=True)
        for kind in ("filters", "plain"):
            (root / kind).mkdir(parents=True)
        for start in range(0, size, BATCH):
            table = _reads(_ids(start, min(BATCH, size - start), "old"), 1764400000.0 + start)
            write_parquet_table(table, str(root / "filters" / f"part-{start}.parquet"))
            _write_plain(table, str(root / "plain" / f"part-{start}.parquet"))
        new_ids = _ids(0, 20, "new")
        new = _reads(new_ids, 1764500000.0)
        write_parquet_table(new, str(root / "filters" / "part-new.parquet"))
        _write_plain(new, str(root / "plain" / "part-new.parquet"))
        sizes = {k: sum(os.path.getsize(p) for p in (root / k).iterdir()) for k in ("filters", "plain")}
        looked_up = {
            "20 new requests + prefill": new_ids + [i.replace("cmpl-", "cmpl-p") for i in new_ids],
            "40 old requests": _ids(0, size, "old")[:: max(1, size // 40)][:40],
        }
        for label, ids in looked_up.items():
            listed = ", ".join(f"'{i}'" for i in ids)
            times = {}
            for kind in ("plain", "filters"):
                # by request id, as the cut reads a table, and by prefill id, as the closure of
                # the requests sharing one reads the records
                files = f"read_parquet('{root / kind}/*.parquet')"
                sql = (
                    f"SELECT * FROM {files} WHERE request_id IN ({listed}) "
                    f"UNION ALL SELECT * FROM {files} WHERE remote_request_id IN ({listed})"
                )
                times[kind] = _best(con, sql)
            assert times["plain"][1] == times["filters"][1], "the same rows either way"
            plain, filtered = times["plain"][0], times["filters"][0]
            print(
                f"{size:>10,}  {label:<26} {plain * 1e3:8.1f}ms {filtered * 1e3:7.1f}ms "
                f"{plain / filtered:5.1f}x  {times['filters'][1]}"
            )
        print(f"{'':>10}  bytes with filters / without: {sizes['filters'] / sizes['plain']:.3f}")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
