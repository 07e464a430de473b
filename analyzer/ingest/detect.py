"""Format detection by content: the first bytes of an object decide, never its name.

Gzip is undone before looking. The name is only a tie-breaker for a JSON object that
could be a config (``config.json``).
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

FORMATS = ("connector_trace", "vllm_log", "prometheus", "model_config", "unknown")


def _head(data: bytes) -> bytes:
    if data[:2] == b"\x1f\x8b":
        try:
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data, 65536)
        except (zlib.error, gzip.BadGzipFile):
            return b""
    return data


def detect_format(head: bytes, name: str = "") -> str:
    """One of FORMATS for an object whose first bytes are ``head``."""
    text = _head(head)
    if looks_like_trace(text):
        return "connector_trace"
    stripped = text.lstrip()
    if stripped.startswith(b"{"):
        try:
            obj = json.loads(stripped)
        except (ValueError, UnicodeDecodeError):
            obj = None
        if isinstance(obj, dict) and ("architectures" in obj or "model_type" in obj):
            return "model_config"
        if obj is None and (b'"architectures"' in stripped or b'"model_type"' in stripped):
            return "model_config"  # a config larger than the head we looked at
    sample = text[:16384]
    if len(_VLLM_LINE.findall(sample)) >= 1:
        return "vllm_log"
    if len(_PROM_LINE.findall(sample)) >= 2 and (
        b"# TYPE" in sample or b"vllm:" in sample or b"agent_" in sample
    ):
        return "prometheus"
    return "unknown"
