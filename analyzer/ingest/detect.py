"""Format detection by content: the first bytes of an object decide, never its name.

Gzip is undone before looking. Each format's sniff (``formats/``) is asked in the
registry's order of precedence; the name is only a tie-breaker (a ``config.json``, a
TensorRT-LLM ``rank_<n>_send.csv``). No sniff fails on what an object holds: JSON nested
deeper than Python's parser goes is judged by its top level.
"""

from __future__ import annotations

import gzip
import zlib

# The time stamp a log collector may put before a line: RFC 3339 (kubectl --timestamps
# writes "...Z", others an offset), or "date time" with no zone (the log's --tz).
COLLECTOR_STAMP = r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?"

# What VLLM_LOGGING_PREFIX puts before the level ("[decode-0] "): one short word.
LOGGING_PREFIX = r"[^\s(\x1b]\S{0,63}"


def _head(data: bytes) -> bytes:
    if data[:2] == b"\x1f\x8b":
        try:
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data, 65536)
        except (zlib.error, gzip.BadGzipFile):
            return b""
    return data


def detect_format(head: bytes, name: str = "") -> str:
    """The name of the text format an object whose first bytes are ``head`` is, or "unknown"."""
    from hybridtrace.ingest.formats import UNKNOWN, detect_text

    fmt = detect_text(_head(head), name)
    return fmt.name if fmt is not None else UNKNOWN
