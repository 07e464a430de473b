"""Format detection by content: the first bytes of an object decide, never its name.

Gzip is undone before looking. The name is only a tie-breaker for a JSON object that
could be a config (``config.json``). Python's JSON parser recurses once per level of
nesting, so a line nested deeper than the recursion limit is looked at only down to its
top level: detection never fails on what an object holds.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib

from hybridtrace.ingest.trace import looks_like_trace

# The time stamp a log collector may put before a line: RFC 3339 (kubectl --timestamps
# writes "...Z", others an offset), or "date time" with no zone (the log's --tz).
COLLECTOR_STAMP = r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?"

# What VLLM_LOGGING_PREFIX puts before the level ("[decode-0] "): one short word.
LOGGING_PREFIX = r"[^\s(\x1b]\S{0,63}"

# "(Worker_TP1 pid=306) INFO 04-21 10:02:11 [worker.py:367] ..." with or without the
# process prefix, the opening bracket, or ANSI colour.
_VLLM_LINE = re.compile(
    # after a collector's stamp, then " | " or a space
    rb"^(?:" + COLLECTOR_STAMP.encode() + rb"(?: \| | ))?"
    rb"(?:\x1b\[[0-9;]*m)?(?:\([A-Za-z][\w]*(?: rank=\d+)? pid=\d+\)(?:\x1b\[[0-9;]*m)? )?"
    rb"(?:" + LOGGING_PREFIX.encode() + rb" )?"
    rb"(?:\x1b\[[0-9;]*m)?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)(?:\x1b\[[0-9;]*m)? "
    rb"(?:\x1b\[[0-9;]*m)?\d\d-\d\d \d\d:\d\d:\d\d",
    re.MULTILINE,
)
_PROM_LINE = re.compile(
    rb"^(?:# (?:HELP|TYPE) [A-Za-z_:][\w:]* |[A-Za-z_:][\w:]*(?:\{[^}]*\})? [-+0-9.eEnaNIf]+)", re.M
)

FORMATS = ("connector_trace", "vllm_log", "prometheus", "model_config", "trtllm_csv", "sglang", "unknown")

# One JSON token: a string, a structural character, or a bare scalar (number, true, null).
_JSON_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{},:]|[^\s"\[\]{},:]+')


def _head(data: bytes) -> bytes:
    if data[:2] == b"\x1f\x8b":
        try:
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data, 65536)
        except (zlib.error, gzip.BadGzipFile):
            return b""
    return data


def _top_level(line: bytes) -> bytes:
    """``line`` with every value nested below its top level replaced by null.

    Read token by token, without recursion, so any depth is fine. A record's ``v`` and
    ``type`` sit at the top level: what is below them cannot make a line a record or not.
    """
    out: list[bytes] = []
    depth = 0
    for token in _JSON_TOKEN.findall(line):
        if token in (b"[", b"{"):
            depth += 1
            if depth == 1:
                out.append(token)  # the top level opens
            elif depth == 2:
                out.append(b"null")  # a nested value: null stands in for all of it
        elif token in (b"]", b"}"):
            if depth == 1:
                out.append(token)  # the top level closes
            depth -= 1
        elif depth <= 1:
            out.append(token)
    return b" ".join(out)


def _too_deep(line: bytes) -> bool:
    try:
        json.loads(line)
    except RecursionError:
        return True
    except (ValueError, UnicodeDecodeError):
        pass
    return False


def _looks_like_trace(text: bytes) -> bool:
    """looks_like_trace, for lines of any depth."""
    try:
        return looks_like_trace(text)
    except RecursionError:
        # some line is nested too deep for the parser: that line is judged by its top level
        lines = [_top_level(line) if _too_deep(line) else line for line in text.splitlines()]
        return looks_like_trace(b"\n".join(lines))


def _json_object(text: bytes) -> dict | None:
    """``text`` parsed, when it is a JSON object Python's parser can read."""
    try:
        obj = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def detect_format(head: bytes, name: str = "") -> str:
    """One of FORMATS for an object whose first bytes are ``head``."""
    text = _head(head)
    if _looks_like_trace(text):
        return "connector_trace"
    stripped = text.lstrip()
    if stripped.startswith(b"{"):
        obj = _json_object(stripped)
        if isinstance(obj, dict) and ("architectures" in obj or "model_type" in obj):
            return "model_config"
        if obj is None and (b'"architectures"' in stripped or b'"model_type"' in stripped):
            return "model_config"  # a config larger than the head we looked at
    # other engines' transfer telemetry, by its own headers and markers (docs/other-engines.md)
    from hybridtrace.ingest.sglang import looks_like_sglang
    from hybridtrace.ingest.trtllm import looks_like_trtllm

    if looks_like_trtllm(text, name):
        return "trtllm_csv"
    if looks_like_sglang(text, name):
        return "sglang"
    sample = text[:16384]
    if len(_VLLM_LINE.findall(sample)) >= 1:
        return "vllm_log"
    if len(_PROM_LINE.findall(sample)) >= 2 and (
        b"# TYPE" in sample or b"vllm:" in sample or b"agent_" in sample
    ):
        return "prometheus"
    return "unknown"
