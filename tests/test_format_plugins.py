"""Input formats as plug-ins: a format is one module and one registry entry.

Two made-up formats, registered only here, are ingested through ``ingest()`` as any
other: a text format read on line by line as it grows, and a binary one rewritten in
place and read as a snapshot each time. And every registered format has what the
checklist in docs/architecture.md ("Adding an input format") asks of it.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from hybridtrace.ingest import formats
from hybridtrace.ingest.formats.base import (
    Chunk,
    Format,
    Head,
    LastLine,
    ObjectContext,
    Parsed,
    Parser,
    Resume,
    WholeParser,
)
from hybridtrace.ingest.rows import with_day
from hybridtrace.ingest.run import ingest
from hybridtrace.schema import TABLES

ROOT = Path(__file__).resolve().parent.parent
OLD = 1_700_000_000.0  # a time long past: the file has gone quiet


# --- a text format read by lines: "HB1 <epoch s> <engine> <message>" heartbeats -------------


class _HeartbeatParser(Parser):
    def __init__(self, context: ObjectContext) -> None:
        self.context = context

    def feed(self, chunk: Chunk) -> Parsed:
        parsed = Parsed()
        rows, bad = [], []
        for i, raw in enumerate(chunk.lines.split()):
            number = chunk.first_line + i
            parts = raw.decode("utf-8", "replace").split(" ", 3)
            try:
                if len(parts) != 4 or parts[0] != "HB1":
                    raise ValueError
                ts = float(parts[1])
            except ValueError:
                text = raw.decode("utf-8", "replace")
                bad.append({"line_number": number, "reason": "not a heartbeat", "raw": text})
                continue
            rows.append({"ts": ts, "engine_id": parts[2], "kind": "heartbeat", "message": parts[3],
                         "event_hash": hashlib.md5(raw).hexdigest(), "source_id": chunk.source_id,
                         "line_number": number})  # fmt: skip
        if rows:
            parsed.add("log_events", with_day(pa.Table.from_pylist(rows), "ts"))
        parsed.reject(bad)
        return parsed


class Heartbeats(Format):
    name = "heartbeats"
    resume = Resume.LINES
    tables = ("log_events",)
    doc = "Heartbeats"

    def sniff(self, head: Head) -> bool:
        return head.data.startswith(b"HB1 ")

    def parser(self, context: ObjectContext) -> Parser:
        return _HeartbeatParser(context)


# --- a binary format rewritten in place: b"CTR1", a slot count, (u64 ns, u64 value) slots ---

MAGIC = b"CTR1"
SLOT = struct.Struct("<QQ")


def counter_file(slots: list[tuple[int, int]]) -> bytes:
    return MAGIC + struct.pack("<I", len(slots)) + b"".join(SLOT.pack(*s) for s in slots)


class _CounterParser(WholeParser):
    def parse_whole(self, chunk: Chunk) -> Parsed:
        parsed = Parsed()
        data = chunk.lines.block
        (count,) = struct.unpack_from("<I", data, 4)
        if len(data) != 8 + count * SLOT.size:
            parsed.error = f"{count} slots do not fit in {len(data)} bytes"
            return parsed
        rows = []
        for i in range(count):
            ns, value = SLOT.unpack_from(data, 8 + i * SLOT.size)
            if ns:  # a slot never written is zero
                rows.append({"ts": ns / 1e9, "instance": self.context.obj.folder, "metric": "test_counter",
                             "labels": "{}", "value": float(value), "source_id": chunk.source_id,
                             "line_number": i})  # fmt: skip
        if rows:
            parsed.add("prom_samples", with_day(pa.Table.from_pylist(rows), "ts"))
        parsed.lines = len(rows)
        return parsed


class Counters(Format):
    name = "counters"
    resume = Resume.NONE
    tables = ("prom_samples",)
    doc = "Counters"

    def sniff(self, head: Head) -> bool:
        return head.data.startswith(MAGIC) and head.size >= 8

    def parser(self, context: ObjectContext) -> Parser:
        return _CounterParser(context)


@pytest.fixture
def registered(monkeypatch):
    """Both made-up formats in a copy of the registry, gone again after the test."""
    monkeypatch.setattr(formats, "REGISTRY", list(formats.REGISTRY))
    formats.register(Heartbeats(), before="connector_trace")
    formats.register(Counters())


def _write(path: Path, data: bytes, mtime: float = OLD) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "r+b" if path.exists() else "wb") as handle:  # in place, as the writer does
        handle.write(data)
    os.utime(path, (mtime, mtime))


def _sql(store: Path, query: str) -> list[tuple]:
    con = duckdb.connect()
    for table in ("log_events", "prom_samples", "rejects", "sources"):
        files = sorted(str(p) for p in (store / table).rglob("*.parquet"))
        if files:
            con.sql(f"CREATE VIEW {table} AS SELECT * FROM read_parquet({files!r}, union_by_name = true)")
    return con.sql(query).fetchall()


def test_a_format_read_by_lines_is_read_on_as_it_grows(tmp_path, registered):
    log = tmp_path / "in" / "e0" / "beats.txt"
    _write(log, b"HB1 1764400000 decode-0 up\nHB1 1764400001 decode-0 busy\nnot one\n")
    first = ingest([tmp_path / "in"], tmp_path / "s")
    assert first.by_format == {"heartbeats": 1} and first.rows["log_events"] == 2 and first.rejects == 1
    before = b"HB1 1764400000 decode-0 up\nHB1 1764400001 decode-0 busy\nnot one\n"
    _write(log, before + b"HB1 1764400002 decode-0 idle\n", mtime=OLD + 10)
    grown = ingest([tmp_path / "in"], tmp_path / "s")
    assert grown.rows["log_events"] == 1 and grown.rejects == 0 and grown.duplicates == 0  # only the new line
    assert _sql(tmp_path / "s", "SELECT start_offset > 0, end_line FROM sources ORDER BY ingested_at") == [
        (False, 3), (True, 4)]  # fmt: skip
    assert _sql(tmp_path / "s", "SELECT line_number, message FROM log_events ORDER BY 1") == [
        (1, "up"), (2, "busy"), (4, "idle")]  # fmt: skip
    assert ingest([tmp_path / "in"], tmp_path / "s").objects_skipped == 1  # unchanged: not opened


def test_a_binary_format_rewritten_in_place_is_read_as_a_snapshot(tmp_path, registered):
    ring = tmp_path / "in" / "agent-0" / "counters.bin"
    slots = [(1764400000_000000000, 5), (1764400001_000000000, 7), (0, 0), (0, 0)]
    _write(ring, counter_file(slots))
    first = ingest([tmp_path / "in"], tmp_path / "s")
    assert first.by_format == {"counters": 1} and first.rows["prom_samples"] == 2
    slots[2] = (1764400002_000000000, 9)  # the writer fills the next slot, in place
    _write(ring, counter_file(slots), mtime=OLD + 10)
    second = ingest([tmp_path / "in"], tmp_path / "s")
    # read whole again: the slots it held before are duplicates, the new one is added
    assert second.rows["prom_samples"] == 1 and second.duplicates == 2
    assert _sql(tmp_path / "s", "SELECT format, start_offset, lines FROM sources ORDER BY ingested_at") == [
        ("counters", 0, 2), ("counters", 0, 3)]  # fmt: skip
    assert _sql(tmp_path / "s", "SELECT value FROM prom_samples ORDER BY ts") == [(5.0,), (7.0,), (9.0,)]
    assert ingest([tmp_path / "in"], tmp_path / "s").objects_skipped == 1


def test_a_binary_object_its_format_refuses_is_an_error_row_read_once(tmp_path, registered):
    bad = tmp_path / "in" / "agent-0" / "counters.bin"
    _write(bad, MAGIC + struct.pack("<I", 5) + SLOT.pack(1, 1))  # five slots announced, one there
    first = ingest([tmp_path / "in"], tmp_path / "s")
    assert first.errors == 1 and "5 slots do not fit in 24 bytes" in first.error_messages[0]
    again = ingest([tmp_path / "in"], tmp_path / "s")
    assert again.objects_read == 0 and again.errors == 1  # the same verdict, no second row
    assert _sql(tmp_path / "s", "SELECT status, message FROM sources") == [
        ("error", "5 slots do not fit in 24 bytes")]  # fmt: skip


def test_a_format_registered_first_takes_precedence(tmp_path, registered):
    # a heartbeat line also reads as a Prometheus sample line; the earlier entry decides
    assert [f.name for f in formats.REGISTRY][:3] == ["nixl_ring", "heartbeats", "connector_trace"]
    data = b"HB1 1764400000 decode-0 # TYPE agent_x counter\nHB1 1764400001 decode-0 agent_y 1\n"
    _write(tmp_path / "in" / "e0" / "beats.txt", data)
    assert ingest([tmp_path / "in"], tmp_path / "s").by_format == {"heartbeats": 1}
    formats.REGISTRY.remove(formats.by_name("heartbeats"))
    assert formats.detect_text(data).name == "prometheus"  # without it, the scrape's sniff takes it


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="registered already"):
        formats.register(formats.by_name("vllm_log"))


# --- the checklist, for every registered format --------------------------------------------

DOC_HEADINGS = set(re.findall(r"^## (.+)$", (ROOT / "docs" / "ingest.md").read_text(), re.M))


@pytest.mark.parametrize("fmt", formats.REGISTRY, ids=lambda f: f.name)
def test_every_registered_format_has_what_the_checklist_asks(fmt):
    assert re.fullmatch(r"[a-z][a-z0-9_]*", fmt.name) and fmt.name not in (formats.UNKNOWN, formats.EMPTY)
    assert type(fmt).sniff is not Format.sniff, "a format needs a sniff"
    assert type(fmt).parser is not Format.parser, "a format needs a parser"
    assert isinstance(fmt.resume, Resume)
    assert fmt.tables and set(fmt.tables) <= set(TABLES), f"{fmt.name}: tables not in schemas/"
    assert fmt.doc in DOC_HEADINGS, f"{fmt.name}: no section '## {fmt.doc}' in docs/ingest.md"
    # a sniff never raises and never takes what is nothing at all
    assert fmt.sniff(Head(b"", "x", 0)) is False
    assert fmt.sniff(Head(b"[" * 100_000, "x", 100_000)) is False
    if fmt.resume is not Resume.NONE:
        assert fmt.last_line(b"x", True) in LastLine


def test_the_registry_keeps_the_order_of_precedence():
    # one name each, in the order detection asks them (docs/architecture.md says why)
    names = [f.name for f in formats.REGISTRY]
    assert names == ["nixl_ring", "connector_trace", "model_config", "agent_map", "trtllm_csv", "sglang",
                     "nixlbench", "vllm_log", "prometheus"]  # fmt: skip
    assert len(set(names)) == len(names)


def test_the_manifest_docs_name_every_registered_format():
    from hybridtrace.schema import table_schema

    (doc,) = [c.doc for c in table_schema("sources").columns if c.name == "format"]
    assert all(fmt.name in doc for fmt in formats.REGISTRY), doc
