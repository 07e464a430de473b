"""Fuzzing the ingest: generated objects of every format, valid records mixed with mutated ones.

Each example writes one object (a connector trace, a vLLM log, a Prometheus scrape, a
config.json) whose lines the generator built knowing what each should become: a row
(with its table key), a reject (with its reason when the mutation decides it), or nothing
(a comment, a line vLLM writes that hybridtrace only counts). Mutations: truncation,
deep nesting, huge values, non-finite numbers, invalid UTF-8, NUL and binary bytes, CRLF
line ends, lines run together by a lone CR, a last line without its newline, gzip. Then,
through ``ingest()``:

- no exception escapes it, and no example runs past the watchdog (60 s);
- every valid record is stored once per distinct key, and nothing else is;
- every malformed line is a reject with its line number (and its reason, where known);
- a second ingest of the same input reads nothing and writes nothing, the ``sources``
  manifest included.

The job file (``hybridtrace run --config job.toml``) and ``hybridtrace ingest`` run as a
scheduler runs them: exit 0 or 2, in one line, never a traceback.

A short profile runs by default (a smoke test of some seconds: 15 to 25 examples of each
format, 3 of each command); HYBRIDTRACE_FUZZ_EXAMPLES=N runs N examples of each format and
N/10 of each command, with lines beyond the 1 MiB limit too (CI runs N=40).
"""

from __future__ import annotations

import contextlib
import faulthandler
import gzip
import hashlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loggen import vllm_line
from tracegen import dropped_record, engine_record, record, release_record

from hybridtrace import trace_v1
from hybridtrace.buckets import ObjectRef
from hybridtrace.ingest.limits import LINE_LIMIT
from hybridtrace.ingest.run import ingest
from hybridtrace.schema import table_schema

LONG = int(os.environ.get("HYBRIDTRACE_FUZZ_EXAMPLES", "0"))
WATCHDOG_S = 60
# Lines beyond the size limit cost a second or so each: only the long profile writes them.
HUGE = LINE_LIMIT + 4096 if LONG else 0
OLD = datetime(2026, 5, 1, tzinfo=UTC).timestamp()  # objects long quiet: a last line is read as it is
T0 = datetime(2026, 4, 21, 10, tzinfo=UTC).timestamp()


def examples(short: int, *, command: bool = False) -> settings:
    n = max(3, LONG // 10) if LONG and command else (LONG or short)
    return settings(
        max_examples=n,
        deadline=None,  # the watchdog bounds an example; nothing here times anything else
        database=None,  # nothing written into the repository
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


class Hang(BaseException):
    """An example ran past the watchdog (a BaseException: no handler in ingest swallows it)."""


@contextlib.contextmanager
def watchdog(seconds: int = WATCHDOG_S) -> Iterator[None]:
    """Fail an example that runs longer than ``seconds``. The alarm interrupts Python code;
    a hang inside native code ends the run with a traceback dump at twice the time."""

    def fire(signum: int, frame: object) -> None:
        raise Hang(f"an example ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    faulthandler.dump_traceback_later(2 * seconds, exit=True)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        faulthandler.cancel_dump_traceback_later()


def rare(draw: st.DrawFn) -> bool:
    """True for about one draw in eight: for the shapes that cost a second each."""
    return draw(st.integers(0, 7)) == 0


# --- what each generated line should become ------------------------------------------------


@dataclass
class Line:
    """One physical line and what the ingest should make of it: ``row`` (in ``table``, under
    ``key``; a key ``None`` is the line's number, and ``numbered`` puts the number first),
    ``reject`` (with a reason its text starts with; ``None``: any reason), or ``none``."""

    data: bytes
    outcome: str
    table: str | None = None
    key: tuple | None = None
    reason: str | None = None
    numbered: bool = False


@dataclass
class Expect:
    rows: dict[str, set] = field(default_factory=dict)  # table -> the keys it must hold
    rejects: dict[int, str | None] = field(default_factory=dict)  # line -> reason (None: any)


def build(lines: list[Line], ending: bytes, last_ending: bool = True) -> tuple[bytes, Expect]:
    """The object's bytes and what it should give, lines numbered as the reader counts them.

    Without ``last_ending`` the last line has no newline: an object cut short."""
    expect = Expect()
    for number, line in enumerate(lines, start=1):
        assert b"\n" not in line.data
        if line.outcome == "row":
            assert line.table is not None
            key = (number,) if line.key is None else (number, *line.key) if line.numbered else line.key
            expect.rows.setdefault(line.table, set()).add(key)
        elif line.outcome == "reject":
            expect.rejects[number] = line.reason
    data = b"".join(line.data + ending for line in lines)
    return (data if last_ending else data[: -len(ending)]), expect


def _parquet(store: Path, table: str, columns: str) -> list[tuple]:
    """Rows of ``table`` as the run wrote them (a new store: nothing compacted or superseded)."""
    files = sorted(str(p) for p in (store / table).rglob("*.parquet"))
    if not files:
        return []
    return duckdb.sql(f"SELECT {columns} FROM read_parquet({files!r}, union_by_name = true)").fetchall()


def _store_files(store: Path) -> dict[str, int]:
    """The store's data and manifest files (not its lock files) and their sizes."""
    return {
        str(p.relative_to(store)): p.stat().st_size
        for p in store.rglob("*")
        if p.suffix in (".parquet", ".json")
    }


def check(folder: Path, store: Path, expect: Expect, keys: dict[str, str], **options: object) -> None:
    """Ingest ``folder`` twice into ``store``: the first read gives ``expect``, the second nothing."""
    with watchdog():
        first = ingest([folder], store, **options)  # type: ignore[arg-type]
    assert first.errors == 0, first.error_messages
    for table, columns in keys.items():
        got = _parquet(store, table, columns)
        assert len(got) == len(set(got)), f"{table}: a key stored twice"
        assert set(got) == expect.rows.get(table, set()), table
    rejects = dict(_parquet(store, "rejects", "line_number, reason"))
    assert set(rejects) == set(expect.rejects), "the lines rejected"
    for number, reason in expect.rejects.items():
        if reason is not None:
            assert rejects[number].startswith(reason), (number, rejects[number], reason)
    files = _store_files(store)
    with watchdog():
        second = ingest([folder], store, **options)  # type: ignore[arg-type]
    assert second.objects_read == 0 and second.rejects == 0 and not any(second.rows.values())
    assert _store_files(store) == files, "the second ingest changed the store"


def put(folder: Path, name: str, data: bytes, gz: bool = False) -> Path:
    """Write an object (gzipped, as a rotated copy is, when ``gz``), long quiet."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (name + ".gz" if gz else name)
    path.write_bytes(gzip.compress(data) if gz else data)
    os.utime(path, (OLD, OLD))
    return path


# --- shared mutations ---------------------------------------------------------------------

# Bytes that are no UTF-8: a stray continuation byte, a lead byte without its tail, an
# overlong form, an encoded surrogate, bytes UTF-8 never uses.
BAD_UTF8 = [b"\x80", b"\xc3\x28", b"\xc0\xaf", b"\xed\xa0\x80", b"\xff", b"\xfe\xfe", b"\xf8\x88\x80\x80\x80"]


def _undecodable(data: bytes) -> bytes:
    """``data``, made sure to be no UTF-8: an inserted byte can complete its neighbours into
    a character (\xe1\x80 and \x80 make U+1000); \xff is in no UTF-8 text."""
    try:
        data.decode()
    except UnicodeDecodeError:
        return data
    return data + b"\xff"


@st.composite
def binary_line(draw: st.DrawFn) -> bytes:
    """Random bytes holding at least one sequence that is no UTF-8 (and no newline)."""
    noise = draw(st.binary(max_size=64)).replace(b"\n", b"")
    at = draw(st.integers(0, len(noise)))
    return _undecodable(noise[:at] + draw(st.sampled_from(BAD_UTF8)) + noise[at:])


@st.composite
def with_bad_utf8(draw: st.DrawFn, data: bytes) -> bytes:
    at = draw(st.integers(0, len(data)))
    return _undecodable(data[:at] + draw(st.sampled_from(BAD_UTF8)) + data[at:])


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


# --- connector trace ----------------------------------------------------------------------

TRACE_KEYS = {
    "transfers": ", ".join(table_schema("transfers").key),
    "requests": ", ".join(table_schema("requests").key),
    "engines": ", ".join(table_schema("engines").key),
    "log_events": "line_number",  # release and dropped records: one event per line
}
ENGINE, PREFILL = "fuzz-decode", "fuzz-prefill"
_FLOATS = {r.name: [f.name for f in r.fields if f.type == "float64"] for r in trace_v1.RECORD_TYPES.values()}
_INTEGERS = {
    r.name: [f.name for f in r.fields if f.type in ("int64", "int32")] for r in trace_v1.RECORD_TYPES.values()
}


def _trace_row(item: dict, data: bytes) -> Line:
    """The line of a valid record, keyed as its table keys it."""
    rtype = trace_v1.record_type(item["type"])
    if rtype.is_event:
        return Line(data, "row", "log_events")
    columns = {f.column: item.get(f.name) for f in rtype.fields}
    columns["source_kind"] = "trace"
    return Line(data, "row", rtype.table, tuple(columns.get(k) for k in table_schema(rtype.table).key))


@st.composite
def trace_record(draw: st.DrawFn) -> dict:
    """A valid record of any type, its values drawn within their ranges."""
    kind = draw(
        st.sampled_from(["transfer", "transfer", "transfer", "request", "engine", "release", "dropped"])
    )
    ts = T0 + draw(st.floats(0, 1e6))
    request = draw(st.text(min_size=1, max_size=16))
    if kind == "engine":
        tp = draw(st.integers(1, 8))
        return engine_record(ENGINE, "decode", tp, ts=ts, rank=draw(st.integers(0, tp - 1)))
    if kind == "release":
        return release_record(PREFILL, request, ts, blocks=draw(st.integers(0, 2**40)))
    if kind == "dropped":
        return dropped_record(ENGINE, draw(st.integers(0, 2**31)), ts)
    if kind == "request":
        missing = draw(st.integers(0, 10**6))
        return record("request", ts=ts, request_id=request, engine_id=ENGINE, remote_engine_id=PREFILL,
                      prompt_tokens=missing + 1, missing_tokens=missing, status="ok")  # fmt: skip
    tp, remote_tp = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    return record(
        "transfer", ts=ts, request_id=request, engine_id=ENGINE, remote_engine_id=PREFILL,
        rank=draw(st.integers(0, tp - 1)), tp_size=tp, remote_rank=draw(st.integers(0, remote_tp - 1)),
        remote_tp_size=remote_tp, status=draw(st.sampled_from(["ok", "failed", "expired"])),
        post_s=draw(st.floats(0, 10)), xfer_s=draw(st.floats(0, 100)), bytes=draw(st.integers(0, 2**50)),
        descriptors=draw(st.integers(0, 10**6)), link=draw(st.sampled_from(["rdma:mlx5_0", "tcp", "nvlink"])),
    )  # fmt: skip


def _with_literal(item: dict, name: str, literal: str) -> bytes:
    """``item`` as JSON with the raw ``literal`` as the value of field ``name``."""
    marked = json.dumps({**item, name: 0.25})
    return marked.replace(f'"{name}": 0.25', f'"{name}": {literal}').encode()


TRACE_MUTATIONS = [
    "valid", "valid", "valid", "repeat", "truncate", "non_finite", "wrong_type", "missing", "range",
    "deep_extra", "deep_field", "huge_value", "bad_utf8", "nul", "binary", "merged", "blank", "huge_line",
]  # fmt: skip


@st.composite
def trace_line(draw: st.DrawFn, valid: list[dict]) -> Line:
    item = draw(trace_record())
    ascii_only = draw(st.booleans())  # text escaped (\u00e9) or written as UTF-8
    text = json.dumps(item, ensure_ascii=ascii_only).encode()
    mutation = draw(st.sampled_from(TRACE_MUTATIONS))
    if mutation == "huge_line" and not (HUGE and rare(draw)):
        mutation = "valid"
    if mutation == "repeat" and valid:  # the same record again: one row
        item = draw(st.sampled_from(valid))
        text = json.dumps(item, ensure_ascii=ascii_only).encode()
        mutation = "valid"
    if mutation in ("valid", "repeat"):
        valid.append(item)
        return _trace_row(item, text)
    chars = text.decode()  # cuts and insertions fall between characters, never inside one
    if mutation == "truncate":  # a proper prefix of an object's text is never JSON
        cut = chars[: draw(st.integers(1, len(chars) - 1))]
        return Line(cut.encode(), "reject", reason="not valid JSON")
    if mutation == "non_finite":
        name = draw(st.sampled_from(_FLOATS[item["type"]]))
        literal, shown = draw(st.sampled_from(
            [("NaN", "nan"), ("Infinity", "inf"), ("-Infinity", "-inf"), ("1e999", "inf"), ("-1e999", "-inf")]
        ))  # fmt: skip
        return Line(
            _with_literal(item, name, literal), "reject", reason=f"{name} is not a finite number: {shown}"
        )
    if mutation in ("wrong_type", "missing", "range"):
        rtype = trace_v1.record_type(item["type"])
        if mutation == "missing":
            name = draw(st.sampled_from(rtype.required))
            bad = {k: v for k, v in item.items() if k != name}
        elif mutation == "range":
            f = draw(st.sampled_from(rtype.ranged))
            bad = {
                **item,
                f.name: {"non_negative": -1, "epoch": 1.0, "tp_size": 0, "rank": 10**6}[f.range or ""],
            }
        else:
            f = draw(st.sampled_from(rtype.fields))
            wrong = {"float64": "1.5", "int64": 1.5, "int32": "7", "string": [1], "bool": 1, "groups": {}}
            bad = {**item, f.name: wrong[f.type]}
        data = json.dumps(bad, ensure_ascii=ascii_only).encode()
        problems = trace_v1.validate(bad)  # the ingester names the first, as validate does
        return Line(data, "reject", reason=problems[0])
    if mutation == "deep_extra":  # nested below a field no reader knows: the record is as it was
        valid.append(item)
        return _trace_row(
            item, text[:-1] + b', "x_deep": ' + deep(draw(st.integers(1, 20_000))).encode() + b"}"
        )
    if mutation == "deep_field":  # a list where a field wants a number
        name = draw(st.sampled_from(_FLOATS[item["type"]] + _INTEGERS[item["type"]]))
        want = trace_v1.TYPES[trace_v1.record_type(item["type"]).field(name).type]
        data = _with_literal(item, name, deep(draw(st.integers(1, 5000))))
        return Line(data, "reject", reason=f"wrong type for {name} (want {want})")
    if mutation == "huge_value":  # a long text, well within the line limit
        valid.append(item)
        return _trace_row(
            item, text[:-1] + b', "x_note": "' + "é".encode() * draw(st.integers(1, 100_000)) + b'"}'
        )
    if mutation == "huge_line":
        return Line(text[:-1] + b', "x_big": "' + b"z" * HUGE + b'"}', "reject", reason="line longer than")
    if mutation == "bad_utf8":
        return Line(draw(with_bad_utf8(text)), "reject", reason="invalid UTF-8")
    if mutation == "nul":  # a raw control character is no JSON, in a string or out of one
        at = draw(st.integers(1, len(chars) - 1))
        return Line((chars[:at] + "\x00" + chars[at:]).encode(), "reject", reason="not valid JSON")
    if mutation == "binary":
        return Line(draw(binary_line()), "reject", reason="invalid UTF-8")
    if mutation == "merged":  # two records run together by a lone CR: one line, no JSON
        other = json.dumps(draw(trace_record())).encode()
        return Line(text + b"\r" + other, "reject", reason="not valid JSON")
    return Line(b" " * draw(st.integers(0, 3)), "none")  # a blank line


def _is_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except (ValueError, RecursionError):
        return False
    return True


@st.composite
def trace_object(draw: st.DrawFn) -> tuple[bytes, Expect]:
    first = engine_record(ENGINE, "decode", 2, ts=T0)  # a record first: the object reads as a trace
    bom = b"\xef\xbb\xbf" if draw(st.booleans()) else b""  # as some editors write
    valid = [first]
    lines = [_trace_row(first, bom + json.dumps(first).encode())]
    lines += draw(st.lists(trace_line(valid), max_size=25))
    last_ending = draw(st.booleans())
    if not last_ending and lines[-1].outcome == "reject" and not _is_json(lines[-1].data):
        lines[-1].reason = None  # no JSON and no newline after it: a record cut short
    return build(lines, draw(st.sampled_from([b"\n", b"\r\n"])), last_ending)


@examples(20)
@given(trace_object(), st.booleans())
def test_fuzz_connector_trace(generated, gz):
    data, expect = generated
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        put(root / "in" / "decode-0", "trace.jsonl", data, gz)
        check(root / "in", root / "store", expect, TRACE_KEYS)


# --- vLLM server log ----------------------------------------------------------------------

LOG_KEYS = {"intervals": "line_hash", "log_events": "line_number, kind"}
LOG_ENGINE = "fuzz-engine-7"
KV_FIELDS = (
    "Num successful transfers", "Avg xfer time (ms)", "P90 xfer time (ms)", "Avg post time (ms)",
    "P90 post time (ms)", "Avg MB per transfer", "Throughput (MB/s)", "Avg number of descriptors",
)  # fmt: skip
# Lowercase letters, other scripts' letters and digits: a message naming no line hybridtrace reads
PLAIN = st.text(st.characters(whitelist_categories=("Ll", "Lo", "Nd"), whitelist_characters=" "), max_size=60)
IMPOSSIBLE = ["02-30 10:00:00", "13-01 10:00:00", "00-05 10:00:00", "04-21 24:00:00", "04-21 10:61:00",
              "04-21 10:00:60", "04-31 23:59:59"]  # fmt: skip
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
API = {"process": "APIServer pid=1", "where": "metrics.py:103"}


def _stamp(second: int) -> str:
    return (datetime(2026, 4, 21, 10, tzinfo=UTC) + timedelta(seconds=second)).strftime("%m-%d %H:%M:%S")


def _line_hash(line: str) -> tuple:
    """The interval's key: the hash of its line's text without colour."""
    return (hashlib.md5(_ANSI.sub("", line).encode()).hexdigest(),)


@st.composite
def kv_message(draw: st.DrawFn) -> str:
    """A `KV Transfer metrics` message in one of the shapes vLLM writes."""
    values = [str(draw(st.integers(0, 10**6)))]
    values += [repr(round(draw(st.floats(0, 1e5)), 3)) for _ in range(6)]
    values.append(repr(round(draw(st.floats(0, 1e4)), 1)))
    shape = draw(st.sampled_from(["plain", "v033", "zeros", "inf", "multi"]))
    if shape == "zeros":  # an interval with failures only
        values = ["0"] * 8
    if shape == "inf":  # numpy's sum of the times was 0: vLLM prints the ratio as inf or nan
        values[1], values[6] = "0.0", draw(st.sampled_from(["inf", "nan"]))
    if shape == "multi":  # MultiConnector prints each connector's dict
        body = ", ".join(f"'{k}': {v}" for k, v in zip(KV_FIELDS, values, strict=True))
        return "KV Transfer metrics: NixlConnector={" + body + "}"
    pairs = [f"{k}={v}" for k, v in zip(KV_FIELDS, values, strict=True)]
    if shape == "v033":
        pairs += [f"Num failed transfers={draw(st.integers(0, 99))}", "Num KV expired reqs=0",
                  "Num notifs after expiry=0"]  # fmt: skip
    return "KV Transfer metrics: " + ", ".join(pairs)


def _event(line: str, kind: str) -> Line:
    return Line(line.encode(), "row", "log_events", (kind,), numbered=True)


LOG_KINDS = [
    "kv", "kv", "kv", "warn", "warn", "warn_tb", "error", "expiry", "failure", "info", "noise", "kv_bad",
    "stamp_bad", "cut_header", "truncated_warn", "binary", "nul_warn", "long_warn", "repeat_kv", "bad_utf8",
    "huge_kv", "huge_warn",
]  # fmt: skip


@st.composite
def log_item(draw: st.DrawFn, second: int, written: list[str]) -> list[Line]:
    """One record of the log (one physical line or more), stamped ``second`` s after its start."""
    stamp, colour = _stamp(second), draw(st.booleans())
    kind = draw(st.sampled_from(LOG_KINDS))
    if kind.startswith("huge") and not (HUGE and rare(draw)):
        kind = "warn"
    if kind == "repeat_kv" and written:  # the same line again: no second interval
        return [Line(draw(st.sampled_from(written)).encode(), "none")]
    if kind in ("kv", "repeat_kv"):
        line = vllm_line(draw(kv_message()), stamp=stamp, colour=colour, **API)
        written.append(line)
        return [Line(line.encode(), "row", "intervals", _line_hash(line))]
    if kind in ("warn", "error", "nul_warn", "long_warn"):
        message = "odd " + draw(PLAIN)
        if kind == "nul_warn":
            message += "\x00" + draw(PLAIN)
        if kind == "long_warn":
            message += "w" * draw(st.integers(1, 100_000))
        level = "ERROR" if kind == "error" else "WARNING"
        return [_event(vllm_line(message, level=level, stamp=stamp, colour=colour), level.lower())]
    if kind == "warn_tb":  # a traceback printed without headers joins the warning before it
        head = vllm_line("odd " + draw(PLAIN), level="WARNING", stamp=stamp, colour=colour)
        tb = [
            "Traceback (most recent call last):",
            '  File "worker.py", line 12, in run',
            "RuntimeError: boom",
        ]
        return [_event(head, "warning")] + [Line(t.encode(), "none") for t in tb]
    if kind == "expiry":
        request = draw(st.text(st.characters(whitelist_categories=("Ll", "Nd"), whitelist_characters="-"),
                               min_size=1, max_size=30))  # fmt: skip
        message = (f"Releasing expired KV blocks for request {request} which were retrieved by "
                   f"{draw(st.integers(0, 8))} remote worker(s) before lease expired.")  # fmt: skip
        return [_event(vllm_line(message, level="WARNING", stamp=stamp, colour=colour), "kv_expired")]
    if kind == "failure":  # a context nested a little is read; nested deeper than Python parses, not
        depth = draw(st.one_of(st.integers(1, 50), st.integers(250, 20_000)))
        context = "{'request_id': 'r-1', 'remote_engine_id': 'p-1', 'nested': " + deep(depth) + "}"
        line = vllm_line(
            f"NIXL transfer failure: transfer_failed | Context: {context}", level="ERROR", stamp=stamp
        )
        if depth <= 50:
            return [_event(line, "transfer_failed")]
        return [Line(line.encode(), "reject", reason="NIXL transfer failure whose context does not parse")]
    if kind == "info":
        return [Line(vllm_line(f"scheduled batch {draw(st.integers(0, 99))}", stamp=stamp).encode(), "none")]
    if kind == "noise":  # printed without a header, and no traceback: counted only
        return [Line(("noise " + draw(PLAIN)).encode(), "none")]
    if kind == "kv_bad":
        message = draw(kv_message())
        name = draw(st.sampled_from(KV_FIELDS[:6]))  # the throughput may say inf
        # no number, not finite, or a count no int64 holds (a time of 1e20 ms is a number)
        counts = ["99999999999999999999", "2.5"] if name == KV_FIELDS[0] else []
        bad = draw(st.sampled_from(["lots", "nan", "-inf", "1e999999", "1.2.3", "\u0663", *counts]))
        if "={" in message:
            message = f"KV Transfer metrics: {name}={bad}"
        else:
            start = message.index(name + "=") + len(name) + 1
            end = message.find(",", start)
            message = message[:start] + bad + (message[end:] if end >= 0 else "")
        line = vllm_line(message, stamp=stamp, colour=colour, **API)
        return [Line(line.encode(), "reject", reason="KV Transfer metrics line whose fields do not parse")]
    if kind == "stamp_bad":
        message = draw(st.one_of(kv_message(), PLAIN.map(lambda t: "odd " + t)))
        line = vllm_line(
            message, level="WARNING", stamp=draw(st.sampled_from(IMPOSSIBLE)), colour=colour, **API
        )
        return [Line(line.encode(), "reject", reason="time stamp is not a date and time")]
    if kind == "cut_header":  # cut before its header ends: a line without one, counted only
        line = vllm_line("odd " + draw(PLAIN), level="WARNING", stamp=stamp)
        return [Line(line[: draw(st.integers(0, line.index("] ")))].encode(), "none")]
    if kind == "truncated_warn":  # cut in its message: still a warning
        line = vllm_line("odd " + draw(PLAIN), level="WARNING", stamp=stamp)
        return [_event(line[: draw(st.integers(line.index("] ") + 1, len(line)))], "warning")]
    if kind == "bad_utf8":
        line = vllm_line("odd " + draw(PLAIN), level="WARNING", stamp=stamp).encode()
        return [Line(draw(with_bad_utf8(line)), "reject", reason="invalid UTF-8")]
    if kind == "huge_kv":  # read only in part, a line that says numbers is not read
        line = vllm_line(draw(kv_message()) + ", Other=" + "z" * HUGE, stamp=stamp, **API)
        return [Line(line.encode(), "reject", reason="line longer than")]
    if kind == "huge_warn":
        return [_event(vllm_line("odd " + "w" * HUGE, level="WARNING", stamp=stamp), "warning")]
    return [Line(draw(binary_line()), "reject", reason="invalid UTF-8")]


@st.composite
def log_object(draw: st.DrawFn) -> tuple[bytes, Expect]:
    lines = [Line(vllm_line(f"Initializing NIXL worker {LOG_ENGINE}", stamp=_stamp(0)).encode(), "none")]
    written: list[str] = []
    for second in range(1, draw(st.integers(1, 26))):
        lines += draw(log_item(second, written))
    # every line ends in \n, or every line in \r\n as in a log written through a TTY
    ending = draw(st.sampled_from([b"\n", b"\r\n"]))
    # A TTY log cut short has a last line without its \r. With a single whole line before it,
    # no rule tells that from a message continued on its last line (the first line's \r):
    # the TTY shape is judged on two whole lines or more.
    last_ending = draw(st.booleans()) or (ending == b"\r\n" and len(lines) < 3)
    return build(lines, ending, last_ending)


@examples(20)
@given(log_object(), st.booleans())
def test_fuzz_vllm_log(generated, gz):
    data, expect = generated
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        put(root / "in" / "decode-0", "vllm.log", data, gz)
        check(root / "in", root / "store", expect, LOG_KEYS, year=2026)
        assert _parquet(root / "store", "engines", "engine_id") in ([], [(LOG_ENGINE,)])
        assert _parquet(root / "store", "log_events", "count(*) FILTER (WHERE ts IS NULL)") in ([], [(0,)])


# --- Prometheus text ----------------------------------------------------------------------

PROM_KEYS = {"prom_samples": "metric, labels, le"}
COUNTER = "vllm:nixl_num_failed_transfers_total"
OTHER_COUNTER = "vllm:nixl_num_kv_expired_reqs_total"
BUCKET = "vllm:nixl_xfer_time_seconds_bucket"
FINITE = st.sampled_from(["0", "1", "2.5", "1e3", "35988.0", "1.407320064e+09", "-0.0", ".5", "7."])
NON_FINITE = st.sampled_from(["NaN", "Nan", "nan", "+Inf", "-Inf", "inf", "+infinity"])
# Any text a label value may hold: its backslashes, quotes and newlines are escaped when written
LABEL_VALUE = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=20),
    st.sampled_from(["a\\b", 'q"q', "}{,= "]),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _sample(metric: str, labels: dict[str, str], value: str) -> str:
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return f"{metric}{{{body}}} {value}" if labels else f"{metric} {value}"


@st.composite
def labels(draw: st.DrawFn, *names: str) -> dict[str, str]:
    return {name: draw(LABEL_VALUE) for name in names}


def _kept(metric: str, labels: dict[str, str], value: str, le: str | None = None) -> Line:
    """A sample hybridtrace keeps, keyed by its series (the time is the file name's for all)."""
    key = (metric, json.dumps(labels, sort_keys=True), None if le is None else float(le))
    written = labels if le is None else {**labels, "le": le}
    return Line(_sample(metric, written, value).encode(), "row", "prom_samples", key)


PROM_KINDS = [
    "counter", "counter", "gauge", "bucket", "comment", "other", "other_nan", "missing_comma", "bad_escape",
    "twice", "nan_counter", "bad_bound", "overflow", "bad_value", "truncated", "binary", "merged",
    "nul_label", "huge",
]  # fmt: skip


@st.composite
def prom_line(draw: st.DrawFn) -> Line:
    kind = draw(st.sampled_from(PROM_KINDS))
    value = draw(FINITE)
    if kind == "huge" and not (HUGE and rare(draw)):
        kind = "counter"
    if kind in ("counter", "nul_label"):  # a NUL is text like any other in a label value
        series = draw(labels("engine", "model_name"))
        if kind == "nul_label":
            series["model_name"] += "\x00"
        return _kept(COUNTER, series, value)
    if kind == "gauge":  # a gauge may say NaN or ±Inf
        series = draw(labels("hostname", "agent_name"))
        metric = draw(st.sampled_from(["agent_xfer_time", "agent_rx_last_bytes"]))
        return _kept(metric, series, draw(st.one_of(FINITE, NON_FINITE)))
    if kind == "bucket":
        le = draw(st.sampled_from(["0.005", "0.1", "5.0", "+Inf", "1", "2e-3"]))
        return _kept(BUCKET, draw(labels("engine")), value, le)
    if kind == "comment":
        text = draw(
            st.sampled_from(["# HELP vllm:nixl_x help", "# TYPE agent_rx_bytes_total counter", "", "# EOF"])
        )
        return Line(text.encode(), "none")
    if kind == "other":  # a series hybridtrace does not keep
        return Line(
            _sample("python_gc_objects_collected_total", draw(labels("generation")), value).encode(), "none"
        )
    if kind == "other_nan":  # any value is fine in a series nobody differences
        return Line(_sample("process_cpu_seconds_total", {}, draw(NON_FINITE)).encode(), "none")
    if kind == "nan_counter":
        line = _sample(OTHER_COUNTER, draw(labels("engine")), draw(NON_FINITE))
        return Line(line.encode(), "reject", reason="counter value is not a finite number")
    if kind == "overflow":
        line = _sample(COUNTER, draw(labels("engine")), draw(st.sampled_from(["1e999", "-1e400"])))
        return Line(line.encode(), "reject", reason="value too large for a double")
    if kind == "bad_bound":
        le = draw(st.sampled_from(["NaN", "-Inf", "fast", "", "1e999"]))
        line = _sample(BUCKET, {**draw(labels("engine")), "le": le}, value)
        return Line(line.encode(), "reject", reason="bucket bound is not a number or +Inf")
    if kind == "truncated":  # cut inside its braces: no sample line
        text = _sample(COUNTER, draw(labels("engine", "model_name")), value)
        cut = text[: draw(st.integers(text.index("{") + 1, text.rindex("}")))]
        return Line(cut.encode(), "reject", reason="not a Prometheus sample line")
    if kind == "merged":  # two sample lines run together by a lone CR
        first = _sample(COUNTER, draw(labels("engine")), value)
        return Line((first + "\r" + _sample(OTHER_COUNTER, draw(labels("engine")), value)).encode(), "reject")
    if kind == "missing_comma":
        line = f'{COUNTER}{{engine="0"{draw(st.sampled_from(["", " "]))}model_name="m"}} 1'
        return Line(line.encode(), "reject", reason="missing comma between labels")
    if kind == "bad_escape":
        line = f'{COUNTER}{{model_name="a\\{draw(st.sampled_from(["q", "t", "x41", "u0041", " "]))}b"}} 1'
        return Line(line.encode(), "reject", reason="invalid escape")
    if kind == "twice":
        return Line(
            f'{COUNTER}{{engine="0",engine="1"}} 1'.encode(), "reject", reason="label engine given twice"
        )
    if kind == "bad_value":
        line = _sample(
            COUNTER, {"engine": "9"}, draw(st.sampled_from(["1_000", "0x10", "one", "\u0661", "1e", "--1"]))
        )
        return Line(line.encode(), "reject", reason="not a Prometheus sample line")
    if kind == "huge":
        line = _sample(COUNTER, {"model_name": "\\" * HUGE}, "1")
        return Line(line.encode(), "reject", reason="line longer than")
    return Line(draw(binary_line()), "reject", reason="invalid UTF-8")


@st.composite
def prom_object(draw: st.DrawFn) -> tuple[bytes, Expect]:
    head = [  # a TYPE line and a sample first: the object reads as a scrape
        Line(f"# TYPE {COUNTER} counter".encode(), "none"),
        _kept(COUNTER, {"engine": "0"}, "1"),
    ]
    lines = head + draw(st.lists(prom_line(), max_size=30))
    # detection sees the last line too when no newline ends it: a scrape of two lines, the
    # last cut short, is still a scrape
    return build(lines, draw(st.sampled_from([b"\n", b"\r\n"])), draw(st.booleans()))


@examples(25)
@given(prom_object(), st.booleans())
def test_fuzz_prometheus(generated, gz):
    data, expect = generated
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        put(root / "in" / "decode-0", "metrics-20260421T100010Z.prom", data, gz)
        check(root / "in", root / "store", expect, PROM_KEYS)
        assert _parquet(root / "store", "prom_samples", "DISTINCT ts") == [(T0 + 10,)]  # the name's time


@pytest.mark.parametrize(
    ("name", "text", "fmt"),
    [
        ("metrics-20260421T100010Z.prom", f"# TYPE {COUNTER} counter\n{COUNTER} 1", "prometheus"),
        ("config.json", '{\n  "architectures": ["LlamaForCausalLM"], "model_type": "llama"}', "model_config"),
    ],
)
def test_a_two_line_object_without_its_last_newline_is_told_by_that_line(tmp_path, name, text, fmt):
    put(tmp_path / "in" / "d", name, text.encode())
    summary = ingest([tmp_path / "in"], tmp_path / "store")
    assert summary.by_format == {fmt: 1}


# --- config.json --------------------------------------------------------------------------

CONFIGS = sorted((Path(__file__).resolve().parent.parent / "analyzer" / "model" / "configs").glob("*.json"))
JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


@st.composite
def config_object(draw: st.DrawFn) -> tuple[bytes, bool]:
    """A config.json's bytes, and whether it is one (a models row) or not (a reject)."""
    config = json.loads(draw(st.sampled_from(CONFIGS)).read_text())
    # architectures first: a cut or a bad byte after it still reads as a config that is broken
    config = {"architectures": config.pop("architectures", ["LlamaForCausalLM"]), **config}
    mutation = draw(st.sampled_from(
        ["valid", "extra", "huge_value", "truncate", "bad_utf8", "nul", "deep", "binary_tail", "crlf"]
    ))  # fmt: skip
    if mutation == "extra":
        config["x_extra"] = draw(JSON_VALUE)
    if mutation == "huge_value":
        config["x_notes"] = "n" * draw(st.integers(1, 500_000))
    text = json.dumps(config, indent=draw(st.sampled_from([None, 2]))).encode()
    after = text.index(b'"architectures"') + len(b'"architectures"')
    if mutation == "crlf":
        return text.replace(b"\n", b"\r\n"), True
    if mutation == "truncate":
        # cut anywhere after the name of the architectures, even on that line: detection
        # sees the last line that no newline ends, so it is still a config, and a broken one
        return text[: draw(st.integers(after, len(text) - 1))], False
    if mutation == "bad_utf8":
        return text[:after] + draw(st.sampled_from(BAD_UTF8)) + text[after:], False
    if mutation == "nul":  # a raw control character in a string is no JSON
        return text[: after - 3] + b"\x00" + text[after - 3 :], False
    if mutation == "deep":  # nested deeper than Python's parser goes
        return text[:-1] + b', "x_deep": ' + deep(draw(st.integers(5000, 50_000))).encode() + b"}", False
    if mutation == "binary_tail":
        return text + b"\n" + draw(binary_line()), False
    return text, True


@examples(15)
@given(config_object())
def test_fuzz_config_json(generated):
    data, valid = generated
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        put(root / "in" / "some-model", "config.json", data)
        with watchdog():
            first = ingest([root / "in"], root / "store")
        assert first.objects_read == 1
        models = _parquet(root / "store", "models", "model")
        rejects = _parquet(root / "store", "rejects", "line_number, format")
        if valid:
            assert len(models) == 1 and rejects == []
            assert _parquet(root / "store", "sources", "format, status") == [("model_config", "ok")]
        else:
            assert models == [] and rejects == [(0, "model_config")]
        files = _store_files(root / "store")
        with watchdog():
            second = ingest([root / "in"], root / "store")
        assert second.objects_read == 0 and _store_files(root / "store") == files


def test_a_malformed_config_is_read_once(tmp_path):
    put(tmp_path / "in" / "m", "config.json", b'{"architectures": ["LlamaForCausalLM"], "hidden_size": 40')
    ingest([tmp_path / "in"], tmp_path / "store")
    files = _store_files(tmp_path / "store")
    again = ingest([tmp_path / "in"], tmp_path / "store")
    assert again.objects_read == 0 and _store_files(tmp_path / "store") == files
    assert again.errors == 1 and "unchanged since" in again.error_messages[0]  # still an input problem
    # mended, it is read again: its row, and the error is over
    put(tmp_path / "in" / "m", "config.json", b'{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096}')
    mended = ingest([tmp_path / "in"], tmp_path / "store")
    assert (mended.objects_read, mended.errors) == (1, 0)
    assert _parquet(tmp_path / "store", "models", "architecture") == [("LlamaForCausalLM",)]
    assert ingest([tmp_path / "in"], tmp_path / "store").errors == 0


def test_an_object_the_run_could_not_read_is_tried_again(tmp_path, monkeypatch):
    # a permission, a read cut short: the next run may read it, so it does
    path = put(tmp_path / "in" / "m", "config.json", b'{"architectures": ["LlamaForCausalLM"]}')
    real_open = ObjectRef.open

    def refused(self):
        if self.uri == str(path.resolve()):
            raise PermissionError(13, "Permission denied", self.uri)
        return real_open(self)

    monkeypatch.setattr(ObjectRef, "open", refused)
    assert ingest([tmp_path / "in"], tmp_path / "store").errors == 1
    monkeypatch.setattr(ObjectRef, "open", real_open)
    again = ingest([tmp_path / "in"], tmp_path / "store")
    assert (again.objects_read, again.errors) == (1, 0)
    assert _parquet(tmp_path / "store", "models", "architecture") == [("LlamaForCausalLM",)]


# --- the commands: hybridtrace run --config job.toml, hybridtrace ingest ---------------------


def _toml(value: object) -> str:
    """A value as TOML writes it (a JSON string is a TOML basic string when non-ASCII stays raw)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(value)


def _job_text(job: dict[str, dict]) -> bytes:
    out = []
    for section, values in job.items():
        out += [f"[{section}]", *(f"{key} = {_toml(value)}" for key, value in values.items())]
    return ("\n".join(out) + "\n").encode()


JOB_MUTATIONS = [
    "valid", "crlf", "wrong_type", "non_finite", "unknown_key", "unknown_section", "no_store", "no_paths",
    "huge_value", "nul_value", "deep", "truncate", "bad_utf8", "raw_nul", "cr", "binary",
]  # fmt: skip
JOB_KEYS = [
    ("inputs", "paths"), ("store", "path"), ("alert", "strict"), ("alert", "lease_s"), ("inputs", "tz"),
    ("inputs", "year"),
]  # fmt: skip


@st.composite
def job_file(draw: st.DrawFn, inputs: str, store: str) -> tuple[bytes, bool]:
    """A job file's bytes, and whether it is a valid one (exit 0)."""
    job: dict[str, dict] = {
        "inputs": {"paths": [inputs], "tz": "UTC"},
        "store": {"path": store},
        "alert": {"strict": draw(st.booleans()), "lease_s": 300, "max_run_s": 3600},
        "thresholds": {"slow_rank_ratio": 0.6},
    }
    mutation = draw(st.sampled_from(JOB_MUTATIONS))
    if mutation == "wrong_type":
        section, key = draw(st.sampled_from(JOB_KEYS))
        job[section][key] = draw(st.sampled_from([7, "x", [1], True, 2.5, []]))
    if mutation == "non_finite":
        job["alert"][draw(st.sampled_from(["lease_s", "max_run_s"]))] = draw(
            st.sampled_from([math.inf, math.nan])
        )
    if mutation == "unknown_key":
        job["alert"]["fail_onn"] = ["any"]
    if mutation == "unknown_section":
        job["alerts"] = {"strict": True}
    if mutation == "no_store":
        del job["store"]
    if mutation == "no_paths":
        job["inputs"]["paths"] = []
    if mutation == "huge_value":
        job["inputs"]["tz"] = "Z" * draw(st.integers(1, 200_000))
    if mutation == "nul_value":
        job["store"]["path"] = store + "\x00x"
    text = _job_text(job)
    if mutation == "deep":
        nested = deep(draw(st.integers(100, 20_000))).encode()
        text = text.replace(b"[inputs]\n", b"[inputs]\nx_deep = " + nested + b"\n")
    if mutation == "truncate":
        text = text[: draw(st.integers(0, len(text) - 1))]
    if mutation == "bad_utf8":
        text = draw(with_bad_utf8(text))
    if mutation == "raw_nul":
        at = draw(st.integers(0, len(text)))
        text = text[:at] + b"\x00" + text[at:]
    if mutation == "crlf":
        text = text.replace(b"\n", b"\r\n")
    if mutation == "cr":
        text = text.replace(b"\n", b"\r")
    if mutation == "binary":
        text = draw(binary_line())
    return text, mutation in ("valid", "crlf")


def _command(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}  # a crash in native code says so on stderr
    command = [sys.executable, "-m", "hybridtrace", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, timeout=WATCHDOG_S, env=env)


def _said_in_one_line(result: subprocess.CompletedProcess) -> None:
    err = result.stderr.decode(errors="replace")
    assert "Traceback" not in err and "Fatal Python error" not in err, err[-3000:]
    assert result.returncode in (0, 2), (result.returncode, err[-3000:])
    if result.returncode == 2:
        assert err.startswith("hybridtrace: error:") and len(err.strip().splitlines()) == 1, err[-3000:]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    """One small deployment's telemetry of every format, for the commands to read."""
    root = tmp_path_factory.mktemp("fuzz-bundle")
    folder = root / "decode-0"
    reads = [
        record("transfer", ts=T0 + i, request_id=f"r{i}", engine_id=ENGINE, remote_engine_id=PREFILL, rank=0,
               tp_size=2, remote_rank=0, remote_tp_size=2, status="ok", xfer_s=0.01, bytes=1 << 20)
        for i in range(5)
    ]  # fmt: skip
    records = [engine_record(ENGINE, "decode", 2), *reads]
    put(folder, "trace.jsonl", b"".join(json.dumps(r).encode() + b"\n" for r in records))
    put(folder, "vllm.log", (vllm_line(f"Initializing NIXL worker {ENGINE}") + "\n").encode())
    put(
        folder,
        "metrics-20260421T100010Z.prom",
        f"# TYPE {COUNTER} counter\n{COUNTER} 1\n{OTHER_COUNTER} 2\n".encode(),
    )
    return root


@examples(3, command=True)
@given(data=st.data())
def test_fuzz_job_file_exits_0_or_2_in_one_line(bundle, data):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        text, valid = data.draw(job_file(str(bundle), str(root / "store")))
        (root / "job.toml").write_bytes(text)
        result = _command(["run", "--config", str(root / "job.toml")], root)
        _said_in_one_line(result)
        out = result.stdout.decode(errors="replace").strip().splitlines()
        assert out and json.loads(out[-1])["status"], out  # one line of JSON for the scheduler's log
        if valid:
            assert result.returncode == 0, result.stderr.decode(errors="replace")


@examples(3, command=True)
@given(trace=trace_object(), log=log_object(), scrape=prom_object(), config=config_object())
def test_fuzz_ingest_command_exits_0_or_2_in_one_line(trace, log, scrape, config):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        put(root / "in" / "decode-0", "trace.jsonl", trace[0])
        put(root / "in" / "decode-0", "vllm.log", log[0])
        put(root / "in" / "decode-0", "metrics-20260421T100010Z.prom", scrape[0])
        put(root / "in" / "model", "config.json", config[0])
        result = _command(["ingest", str(root / "in"), "--store", str(root / "store")], root)
        _said_in_one_line(result)
        if config[1]:  # a config.json that does not parse is an input problem: exit 2
            assert result.returncode == 0, result.stderr.decode(errors="replace")
