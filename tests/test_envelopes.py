"""Logs as they sit in buckets: each envelope unwraps to the bare vLLM lines it carries."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from hybridtrace.ingest.envelopes import Instance, Unwrapper, instance_from_path, sniff, vllm_record_lines
from tests import envelopegen

# vLLM 0.33's own text lines (docs: ../shared/formats/vllm-telemetry.md, measured by running
# its logging and stats code)
KV = (
    "(MainProcess pid=17951) INFO 12-01 19:03:{s:02d} [metrics.py:108] KV Transfer metrics: "
    "Num successful transfers=3, Avg xfer time (ms)=9.862, P90 xfer time (ms)=9.862, "
    "Avg post time (ms)=5.693, P90 post time (ms)=5.693, Avg MB per transfer=70.0, "
    "Throughput (MB/s)=7097.952, Avg number of descriptors=56.0, "
    "Num failed transfers=0, Num KV expired reqs=0, Num notifs after expiry=0"
)
LINES = [KV.format(s=s) for s in (0, 10, 20, 30)]


def unwrap(kind: str, text: str, path: Instance | None = None) -> tuple[dict, list]:
    unwrapper = Unwrapper(kind, path or Instance())
    out = unwrapper.feed(text.split("\n")[:-1], 1, final=True)
    return {k: [t for _, t in v] for k, v in out.groups.items()}, out.rejects


@pytest.mark.parametrize("kind", sorted(envelopegen.WRAPPERS))
def test_every_envelope_gives_back_its_lines_with_the_envelope_stamp(kind: str) -> None:
    text = envelopegen.WRAPPERS[kind](LINES)
    envelope = "loki" if kind == "loki_push" else kind
    assert sniff(text.split("\n")[:20]) == envelope
    groups, rejects = unwrap(envelope, text)
    assert rejects == []
    (lines,) = groups.values()
    assert [line.split(" ", 1)[1] for line in lines] == LINES
    # the envelope's stamp (RFC 3339, UTC) goes first: it carries year and zone
    assert lines[0].startswith("2026-12-01T19:03:00")


@pytest.mark.parametrize("kind", ["fluentbit", "vector", "loki", "loki_push", "otlp", "gcp"])
def test_the_envelope_names_the_pod(kind: str) -> None:
    pods = [{"namespace": "llm", "pod": f"decode-{i}", "container": "vllm"} for i in range(3)]
    text = envelopegen.WRAPPERS[kind](LINES * 3, pods)
    groups, _ = unwrap("loki" if kind == "loki_push" else kind, text)
    assert sorted(i.pod for i in groups) == ["decode-0", "decode-1", "decode-2"]
    assert {i.namespace for i in groups} == {"llm"} and {i.container for i in groups} == {"vllm"}
    assert all(len(lines) == 4 for lines in groups.values())


def test_cloudwatch_names_the_container_of_its_log_stream() -> None:
    groups, _ = unwrap("cloudwatch", envelopegen.cloudwatch_subscription(LINES))
    assert list(groups) == [Instance("llm", "decode-0", "vllm")]


def test_kubelet_paths_name_the_container() -> None:
    assert instance_from_path("s3://logs/var/log/pods/llm_decode-0_5d1c1e8e/vllm/0.log") == Instance(
        "llm", "decode-0", "vllm"
    )
    name = "/var/log/containers/decode-1_llm_vllm-" + "e" * 64 + ".log"
    assert instance_from_path(name) == Instance("llm", "decode-1", "vllm")
    assert instance_from_path("/logs/prefill-0/vllm.log") == Instance()


@pytest.mark.parametrize("kind", ["cri", "docker"])
def test_partial_lines_are_joined_also_across_chunks(kind: str) -> None:
    text = envelopegen.WRAPPERS[kind](LINES, split_at=100)
    records = text.split("\n")[:-1]
    assert len(records) > 4 * 3
    unwrapper = Unwrapper(kind)
    got: list[str] = []
    for at in range(0, len(records), 5):  # chunks that end mid-line
        out = unwrapper.feed(records[at : at + 5], at + 1, final=False)
        got += [t for group in out.groups.values() for _, t in group]
        assert out.rejects == []
    got += [t for group in unwrapper.feed([], len(records) + 1, final=True).groups.values() for _, t in group]
    assert [line.split(" ", 1)[1] for line in got] == LINES


def test_a_partial_line_waiting_for_its_end_is_held_back() -> None:
    records = envelopegen.cri(LINES[:1], split_at=100).split("\n")[:-1]
    unwrapper = Unwrapper("cri")
    out = unwrapper.feed(records[:-1], 7, final=False)
    assert out.groups == {} and unwrapper.held_from() == 7
    out = unwrapper.feed(records[-1:], 7 + len(records) - 1, final=False)
    assert unwrapper.held_from() is None
    ((number, line),) = next(iter(out.groups.values()))
    assert number == 7 and line.endswith(LINES[0])


def test_bad_envelope_lines_are_rejects_with_their_line() -> None:
    good = envelopegen.cri(LINES[:2]).split("\n")[:-1]
    _, rejects = unwrap("cri", "\n".join([good[0], "not a cri line", good[1]]) + "\n")
    assert [(r["line_number"], r["reason"]) for r in rejects] == [(2, "not a CRI log line")]
    good = envelopegen.docker(LINES[:2]).split("\n")[:-1]
    text = "\n".join([good[0], '{"log": 5}', "{broken", good[1]]) + "\n"
    groups, rejects = unwrap("docker", text)
    assert [r["line_number"] for r in rejects] == [2, 3]
    assert len(next(iter(groups.values()))) == 2


def test_firehose_puts_several_subscription_payloads_on_one_line() -> None:
    text = envelopegen.cloudwatch_subscription(LINES, per_record=1)
    assert text.count("\n") == 1 and text.count("DATA_MESSAGE") == 4
    groups, rejects = unwrap("cloudwatch", text)
    assert rejects == [] and len(next(iter(groups.values()))) == 4


def test_a_cloudwatch_export_needs_no_unwrapping() -> None:
    # "<ISO stamp> <message>" is a collector stamp the vLLM parser reads as it stands
    lines = envelopegen.cloudwatch_export(LINES).split("\n")[:-1]
    assert sniff(lines) is None
    assert lines[0].startswith("2026-12-01T19:03:00.000Z (MainProcess pid=17951) INFO")


RECORD = {
    "asctime": "2026-12-01 19:03:12,480",
    "levelname": "INFO",
    "name": "vllm.distributed.kv_transfer.kv_connector.v1.metrics",
    "processName": "MainProcess",
    "process": 17961,
    "message": "KV Transfer metrics: Num successful transfers=3",
    "vllm_process_name": "MainProcess",
}


def test_vllms_json_record_becomes_the_line_its_text_formatter_writes() -> None:
    (line,) = vllm_record_lines(RECORD, None)
    assert line == (
        "2026-12-01 19:03:12.480 (MainProcess pid=17961) INFO 12-01 19:03:12 [metrics.py:0] "
        "KV Transfer metrics: Num successful transfers=3"
    )
    # inside an envelope, the envelope's stamp wins
    (line,) = vllm_record_lines(RECORD, "2026-12-01T19:03:12.481Z")
    assert line.startswith("2026-12-01T19:03:12.481Z (MainProcess pid=17961) INFO 12-01 19:03:12 ")


def test_a_multi_line_json_message_keeps_vllms_continuation_shape() -> None:
    traceback = 'Traceback (most recent call last):\n  File "a.py", line 1\nValueError: y'
    record = {**RECORD, "levelname": "ERROR", "message": "NIXL transfer failure: x", "exc_info": traceback}
    lines = vllm_record_lines(record, None)
    assert len(lines) == 4
    assert all(line.endswith("\r") for line in lines[:-1]) and not lines[-1].endswith("\r")
    assert all(" ERROR 12-01 19:03:12 [metrics.py:0] " in line for line in lines)


def test_json_records_inside_envelopes_are_unwrapped_twice() -> None:
    inner = json.dumps(RECORD)
    for kind in ("docker", "cri", "fluentbit", "gcp"):
        text = envelopegen.WRAPPERS[kind]([inner])
        groups, rejects = unwrap(kind, text)
        assert rejects == [], kind
        (lines,) = groups.values()
        assert lines[0].endswith("INFO 12-01 19:03:12 [metrics.py:0] " + RECORD["message"])
    # Cloud Logging parses a JSON line into jsonPayload
    entry = json.loads(envelopegen.gcp(["x"]))
    entry.pop("textPayload")
    entry["jsonPayload"] = RECORD
    groups, _ = unwrap("gcp", json.dumps(entry) + "\n")
    assert next(iter(groups.values()))[0].endswith("Num successful transfers=3")


def test_a_json_record_without_time_is_a_reject() -> None:
    record = {k: v for k, v in RECORD.items() if k != "asctime"}
    record["name"] = "vllm.x"
    _, rejects = unwrap("vllm_json", json.dumps(record) + "\n")
    assert len(rejects) == 1 and "asctime" in rejects[0]["reason"]


def test_sniff_wants_vllm_lines_inside() -> None:
    assert sniff(envelopegen.docker(["hello world", "just an app"]).split("\n")) is None
    assert sniff([json.dumps(RECORD)]) == "vllm_json"
    assert sniff(["{" * 100000]) is None
    assert sniff(["plain text"]) is None


def test_hostile_nesting_and_sizes_do_not_escape() -> None:
    deep = '{"log": ' + "[" * 50000 + "]" * 50000 + ', "time": "2026-12-01T00:00:00Z"}'
    _, rejects = unwrap("docker", deep + "\n")
    assert len(rejects) == 1
    nested = json.dumps({"log": json.dumps({"log": json.dumps({"log": json.dumps({"log": "x"})})}),
                         "stream": "stdout", "time": "2026-12-01T00:00:00Z"})  # fmt: skip
    groups, rejects = unwrap("docker", nested + "\n")
    assert rejects == [] and len(next(iter(groups.values()))) == 1


# -- through ingest: the same lines give the same rows, whatever they arrived in ------------

from loggen import ENGINE_ID, decode_log, prefill_log  # noqa: E402

from hybridtrace.ingest.run import ingest  # noqa: E402
from hybridtrace.store import Store  # noqa: E402

# what differs by construction: where a row was read, and the stamp text the event's hash covers
_WHERE = {"source_id", "line_number", "event_hash", "day", "line_hash"}


def _tables(store: Path) -> dict[str, list[tuple]]:
    con = Store(store).connect()
    out = {}
    for table in ("intervals", "log_events", "engines"):
        cols = [c for c in con.sql(f"SELECT * FROM {table} LIMIT 0").columns if c not in _WHERE]
        out[table] = sorted(con.sql(f"SELECT {', '.join(cols)} FROM {table}").fetchall(), key=repr)
    return out


def _ingest(tmp_path: Path, name: str, text: str, folder: str = "decode-0") -> dict[str, list[tuple]]:
    path = tmp_path / name / folder / "vllm.log"
    path.parent.mkdir(parents=True)
    path.write_text(text, encoding="utf-8")
    os.utime(path, (time.time() - 3600, time.time() - 3600))  # gone quiet: read to its end
    ingest([tmp_path / name], tmp_path / f"{name}-store", year=2026)
    return _tables(tmp_path / f"{name}-store")


@pytest.mark.parametrize("kind", sorted(envelopegen.WRAPPERS))
def test_an_envelope_gives_the_rows_of_the_bare_log(tmp_path: Path, kind: str) -> None:
    lines = decode_log(stamp_day="12-01").split("\n")
    lines = [line for line in lines if line]
    bare = _ingest(tmp_path, "bare", "\n".join(lines) + "\n")
    assert bare["intervals"] and bare["log_events"] and bare["engines"]
    wrapped = _ingest(tmp_path, kind, envelopegen.WRAPPERS[kind](lines))
    assert wrapped == bare


def test_a_collector_file_of_three_pods_gives_three_engines(tmp_path: Path) -> None:
    pods = [{"namespace": "llm", "pod": f"decode-{i}", "container": "vllm"} for i in range(3)]
    # each pod's own log, interleaved line by line; the second pod states no NIXL engine id
    logs = [[line for line in decode_log(stamp_day="12-01").split("\n") if line] for _ in pods]
    logs[0] = [line.replace(ENGINE_ID, "engine-a") for line in logs[0]]
    logs[1] = [line for line in logs[1] if "Initializing NIXL" not in line]
    logs[2] = [line.replace(ENGINE_ID, "engine-c") for line in logs[2]]
    lines, owners = [], []
    for i in range(max(map(len, logs))):
        for pod, log in zip(pods, logs, strict=True):
            if i < len(log):
                lines.append(log[i])
                owners.append(pod)
    for kind in ("fluentbit", "vector", "loki", "gcp"):
        wrap = envelopegen.WRAPPERS[kind]
        text = "".join(wrap([line], [pod]) for line, pod in zip(lines, owners, strict=True))
        path = tmp_path / kind / "collector" / "part-0000.json"
        path.parent.mkdir(parents=True)
        path.write_text(text)
        ingest([tmp_path / kind], tmp_path / f"{kind}-store", year=2026)
        con = Store(tmp_path / f"{kind}-store").connect()
        engines = con.sql("SELECT engine_id, count(*) FROM intervals GROUP BY 1 ORDER BY 1").fetchall()
        assert engines == [("decode-1", 2), ("engine-a", 2), ("engine-c", 2)], kind
        ((instances,),) = con.sql("SELECT instances FROM sources").fetchall()
        assert json.loads(instances) == {"llm/decode-0/vllm": "engine-a", "llm/decode-2/vllm": "engine-c"}


def test_a_growing_envelope_file_resumes_without_loss_or_double_count(tmp_path: Path) -> None:
    pods = [{"namespace": "llm", "pod": f"decode-{i}", "container": "vllm"} for i in range(2)]
    # two pods' logs interleaved line by line (each keeps its multi-line events whole)
    logs = [decode_log(stamp_day="12-01"), prefill_log(stamp_day="12-01")]
    logs = [[line for line in log.split("\n") if line] for log in logs]
    records, whole_events = [], []
    for i in range(max(map(len, logs))):
        for pod, log in zip(pods, logs, strict=True):
            if i < len(log):
                records.append(envelopegen.vector([log[i]], [pod]))
                # a read may end only where no multi-line event is still being written (vLLM
                # writes one at once); a cut inside one is read as a bare log's would be
                whole_events.append(not log[i].endswith("\r"))
    whole = tmp_path / "whole" / "c" / "x.json"
    whole.parent.mkdir(parents=True)
    whole.write_text("".join(records))
    ingest([tmp_path / "whole"], tmp_path / "whole-store", year=2026)
    growing = tmp_path / "grow" / "c" / "x.json"
    growing.parent.mkdir(parents=True)
    for share in (3, 2, 1):
        cut = len(records) // share
        while not all(whole_events[cut - 2 : cut]):
            cut += 1
        growing.write_text("".join(records[:cut]))
        ingest([tmp_path / "grow"], tmp_path / "grow-store", year=2026)
    grown, whole_rows = _tables(tmp_path / "grow-store"), _tables(tmp_path / "whole-store")
    assert grown["intervals"] == whole_rows["intervals"]
    events = "SELECT DISTINCT engine_id, kind, ts, request_id FROM log_events ORDER BY ALL"
    assert Store(tmp_path / "grow-store").connect().sql(events).fetchall() == (
        Store(tmp_path / "whole-store").connect().sql(events).fetchall()
    )


def test_gzip_and_bad_lines_inside_an_envelope(tmp_path: Path) -> None:
    import gzip

    lines = [line for line in decode_log(stamp_day="12-01").split("\n") if line]
    text = envelopegen.docker(lines).split("\n")
    text.insert(3, '{"log": 5, "stream": "stdout", "time": "2026-12-01T00:00:00Z"}')
    text.insert(5, "garbage")
    path = tmp_path / "in" / "decode-0" / "vllm.log.gz"
    path.parent.mkdir(parents=True)
    path.write_bytes(gzip.compress("\n".join(text).encode()))
    ingest([tmp_path / "in"], tmp_path / "s", year=2026)
    con = Store(tmp_path / "s").connect()
    assert con.sql("SELECT line_number FROM rejects ORDER BY 1").fetchall() == [(4,), (6,)]
    bare = _ingest(tmp_path, "bare", "\n".join(lines) + "\n")
    assert _tables(tmp_path / "s")["intervals"] == bare["intervals"]


# -- fuzzing: generated envelope objects, valid records mixed with broken ones -------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from loggen import kv_metrics, vllm_line  # noqa: E402

_FUZZ = int(os.environ.get("HYBRIDTRACE_FUZZ_EXAMPLES", "0")) or 12
_KINDS = ["cri", "docker", "fluentbit", "vector", "loki", "gcp"]  # one envelope line per vLLM line


@st.composite
def _enveloped(draw: st.DrawFn) -> tuple[str, list[str], list[int]]:
    """(envelope, bare lines, the lines broken in the envelope) of one generated object."""
    lines = [vllm_line(f"Initializing NIXL worker {ENGINE_ID}", stamp="12-01 10:00:00")]
    for second in range(1, draw(st.integers(1, 30))):
        stamp = f"12-01 10:{second // 60:02d}:{second % 60:02d}"
        kind = draw(st.sampled_from(["kv", "warning", "stats", "other"]))
        if kind == "kv":
            n = draw(st.integers(0, 50))
            lines.append(kv_metrics(n, draw(st.floats(0.1, 900, allow_nan=False)), 14.0, stamp))
        elif kind == "warning":
            text = draw(st.text(st.characters(whitelist_categories=("Ll", "Nd")), min_size=1, max_size=30))
            lines.append(vllm_line(f"odd {text}", level="WARNING", stamp=stamp))
        elif kind == "stats":
            message = "Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tok/s"
            lines.append(vllm_line(message, stamp=stamp, process="APIServer pid=1"))
        else:
            lines.append(vllm_line("something only counted", stamp=stamp))
    broken = sorted(draw(st.sets(st.integers(2, len(lines)), max_size=3))) if len(lines) > 1 else []
    return draw(st.sampled_from(_KINDS)), lines, broken


_BREAKS = ["not an envelope line", '{"cut": ', "{" * 100 + "[" * 20000, '{"log": 5, "time": 1}', "\x00\x01"]


@settings(max_examples=_FUZZ, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@given(_enveloped(), st.sampled_from(_BREAKS), st.booleans())
def test_fuzz_envelopes(generated: tuple[str, list[str], list[int]], breaking: str, gz: bool) -> None:
    import gzip
    import tempfile

    kind, lines, broken = generated
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        records = [line for line in envelopegen.WRAPPERS[kind](lines).split("\n") if line]
        assert len(records) == len(lines)
        for number in broken:  # a broken envelope line; the bare twin has nothing there
            records[number - 1] = breaking
        data = ("\n".join(records) + "\n").encode()
        path = root / "env" / "decode-0" / ("x.log.gz" if gz else "x.log")
        path.parent.mkdir(parents=True)
        path.write_bytes(gzip.compress(data) if gz else data)
        os.utime(path, (time.time() - 3600, time.time() - 3600))
        first = ingest([root / "env"], root / "env-store", year=2026)
        assert first.errors == 0, first.error_messages
        bare = [("" if i + 1 in broken else line) for i, line in enumerate(lines)]
        got, want = _tables(root / "env-store"), _ingest(root, "bare", "\n".join(bare) + "\n")
        assert got == want
        con = Store(root / "env-store").connect()
        assert [r[0] for r in con.sql("SELECT line_number FROM rejects ORDER BY 1").fetchall()] == broken
        second = ingest([root / "env"], root / "env-store", year=2026)
        assert second.objects_read == 0 and not any(second.rows.values())


@pytest.mark.parametrize("kind", ["cri", "docker"])
def test_broken_records_of_another_kind_do_not_hide_the_envelope(tmp_path: Path, kind: str) -> None:
    # The first lines of a CRI file: one vLLM line, then two JSON lines the collector broke
    # (they look like Docker's records, more of them than CRI lines). The envelope is the kind
    # whose records unwrap to vLLM lines, not the most common kind: the broken lines are
    # rejects, and the good one is read as the bare log reads it.
    lines = [vllm_line(f"Initializing NIXL worker {ENGINE_ID}", stamp="12-01 10:00:00")]
    lines += [vllm_line("something only counted", stamp=f"12-01 10:00:0{s}") for s in (1, 2, 3)]
    records = [line for line in envelopegen.WRAPPERS[kind](lines).split("\n") if line]
    other = "2026-12-01T10:00:00.000000000Z stdout F garbage" if kind == "docker" else '{"log": 5, "time": 1}'
    records[1] = records[2] = other
    path = tmp_path / "env" / "decode-0" / "x.log"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(records) + "\n", encoding="utf-8")
    os.utime(path, (time.time() - 3600, time.time() - 3600))
    ingest([tmp_path / "env"], tmp_path / "env-store", year=2026)
    con = Store(tmp_path / "env-store").connect()
    assert con.sql("SELECT format, status FROM sources").fetchall() == [("vllm_log", "ok")]
    assert [r[0] for r in con.sql("SELECT line_number FROM rejects ORDER BY 1").fetchall()] == [2, 3]
    bare = _ingest(tmp_path, "bare", "\n".join([lines[0], "", "", lines[3]]) + "\n")
    assert _tables(tmp_path / "env-store") == bare
