"""Dedupe against the store opens only the files a batch's key range can collide with, and
stays exact: files this run wrote are skipped by their range, every other file is read."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from tracegen import transfer_records

from hybridtrace.ingest import run as ingest_run
from hybridtrace.ingest.run import ingest
from hybridtrace.store import Store
from hybridtrace.store.roots import LocalRoot


@pytest.fixture
def scans(monkeypatch) -> list[list[str]]:
    """The transfers files each dedupe scan opens."""
    opened: list[list[str]] = []
    scan = LocalRoot.scan

    def recorded(self, con, name, files, schema):
        if name == "transfers":
            opened.append(list(files))
        return scan(self, con, name, files, schema)

    monkeypatch.setattr(LocalRoot, "scan", recorded)
    return opened


def _trace(path: Path, requests: int, seed: int = 0) -> list[str]:
    lines = [json.dumps(r) for r in transfer_records(requests, seed=seed)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return lines


def _count(store: Path, sql: str) -> int:
    return Store(store).connect(with_queries=False).sql(sql).fetchall()[0][0]


def test_a_trace_read_in_slices_opens_no_earlier_slice(tmp_path, monkeypatch, scans):
    # each slice's times come after every earlier slice's: no stored file can hold its keys
    monkeypatch.setattr(ingest_run, "BATCH_ROWS", 30)
    monkeypatch.setattr(ingest_run, "CHUNK_BYTES", 4096)
    lines = _trace(tmp_path / "in" / "decode-0" / "trace.jsonl", 60)
    summary = ingest([tmp_path / "in"], tmp_path / "store")
    assert len(Store(tmp_path / "store").committed_batches()) > 2  # read in several slices
    assert scans == []
    assert summary.duplicates == 0
    assert _count(tmp_path / "store", "SELECT count(*) FROM transfers") == 120
    assert _count(tmp_path / "store", "SELECT count(*) FROM requests") == len(lines) - 120


def test_a_copy_read_in_the_same_run_is_deduped_against_the_files_it_overlaps(tmp_path, monkeypatch, scans):
    monkeypatch.setattr(ingest_run, "BATCH_OBJECTS", 1)  # each object its own batch
    raw = "\n".join(_trace(tmp_path / "in" / "a" / "trace.jsonl", 10)) + "\n"
    (tmp_path / "in" / "a" / "trace.jsonl.1.gz").write_bytes(gzip.compress(raw.encode()))
    summary = ingest([tmp_path / "in"], tmp_path / "store")
    assert summary.duplicates == 30  # 20 transfers and 10 requests, all held already
    assert _count(tmp_path / "store", "SELECT count(*) FROM transfers") == 20
    assert scans and all(files for files in scans)  # the overlapping file was read


def test_files_of_an_earlier_run_are_read_whatever_their_range(tmp_path, scans):
    # a file another process wrote has no range in memory: it is scanned, so a copy of old
    # records read by a later run is still found
    _trace(tmp_path / "in" / "a" / "trace.jsonl", 5)
    ingest([tmp_path / "in"], tmp_path / "store")
    assert scans == []
    _trace(tmp_path / "in" / "b" / "trace.jsonl", 5)  # the same records under another name
    summary = ingest([tmp_path / "in"], tmp_path / "store")
    assert summary.duplicates == 15
    assert len(scans) == 1 and len(scans[0]) == 1
    assert _count(tmp_path / "store", "SELECT count(*) FROM transfers") == 10
