"""Prometheus text exposition snapshots → ``prom_samples`` rows.

A snapshot is one scrape. Only the series hybridtrace uses are kept: vLLM's
``vllm:nixl_*`` histograms and counters, ``vllm:prompt_tokens_by_source_total``, and
NIXL's own exporter (``agent_*``). Cumulative values stay cumulative here; the
``intervals`` view turns consecutive scrapes into per-interval deltas (counter resets
included), so a scrape that arrives late still lands in the right place.

A sample's time is its own timestamp when it carries one (milliseconds in Prometheus
text, seconds in OpenMetrics: told apart by size), so a file holding several scrapes
keeps them apart; a sample without one takes the latest stamped time of its file, else a
time written in the object's name, else the object's modification time.

A line is read by the text exposition format: label pairs separated by commas, the only
escapes in a label value ``\\``, ``\"`` and ``\n``, a value that is a decimal number,
``NaN`` or ``±Inf``. Non-finite values are kept where the format and the views allow them
(a gauge's value, the ``+Inf`` bucket bound); a counter, a histogram's count, sum or
bucket and a ``_created`` time must be finite, since the ``intervals`` view differences
and sums them. A number too large for a double is no number. Anything else is a reject
with its reason.
"""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime

from hybridtrace.ingest.limits import LINE_LIMIT
from hybridtrace.units import EPOCH_RANGE

RAW_LIMIT = 512
NOT_A_SAMPLE = "not a Prometheus sample line"
KEEP_PREFIXES = (
    "vllm:nixl_",
    "vllm:prompt_tokens_by_source",
    "agent_",
    # SGLang's transfer families, per rank (sglang_rank_intervals)
    "sglang:kv_transfer_",
    "sglang:num_transfer_failed_reqs",
    "sglang:num_bootstrap_failed_reqs",
)

_SAMPLE = re.compile(
    r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)"
    r"(?:\s+(?P<ts>-?[0-9]+(?:\.[0-9]+)?))?\s*$"
)
# One label pair. The value's repeats are possessive: the plain alternation kept a
# backtracking entry per character, gigabytes for a label of a few megabytes.
_LABEL = re.compile(r'[ \t]*([A-Za-z_][A-Za-z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]++|\\.)*+)"[ \t]*')
_ESCAPE = re.compile(r"\\(.)", re.S)
# A value is a decimal number in ASCII digits, or NaN or infinity in any case
# (prometheus-cpp writes "Nan", Python's client "NaN" and "+Inf"); a number that reads as
# infinity without saying so is too large for a double.
_NON_FINITE = re.compile(r"[+-]?(?:inf|infinity|nan)", re.I)
# Names whose samples the views difference and sum: finite values only.
_COUNTER_SUFFIXES = ("_total", "_count", "_sum", "_bucket", "_created")
_NAME_STAMP = re.compile(r"(20\d\d)-?(\d\d)-?(\d\d)[T_-]?(\d\d)[:-]?(\d\d)[:-]?(\d\d)")
_NAME_EPOCH = re.compile(r"(?<!\d)(1[5-9]\d{8})(?:\.\d+)?(?!\d)")
_NAME_EPOCH_MS = re.compile(r"(?<!\d)(1[5-9]\d{11})(?!\d)")
# Only these three are escapes in a label value (the text exposition format); any other
# backslash makes the line malformed.
_ESCAPES = {"n": "\n", "\\": "\\", '"': '"'}
# A sample timestamp below this is in seconds (OpenMetrics); above, in milliseconds.
_SECONDS_BELOW = 1e11


def _stamp(text: str) -> float:
    value = float(text)
    return value if "." in text or abs(value) < _SECONDS_BELOW else value / 1000.0


def _quoted(text: str) -> str:
    """Input quoted in a reason: its start (the raw column holds more)."""
    return text if len(text) <= 64 else text[:64] + "…"


def _labels(text: str | None) -> tuple[dict[str, str], str | None]:
    """The label pairs of a sample, or the reason they are malformed."""
    labels: dict[str, str] = {}
    if not text or not text.strip():
        return labels, None
    position = 0
    while True:
        match = _LABEL.match(text, position)
        if not match:
            return labels, NOT_A_SAMPLE
        name, raw = match.group(1), match.group(2)
        escapes = [m.group(1) for m in _ESCAPE.finditer(raw)] if "\\" in raw else []
        if bad := next((e for e in escapes if e not in _ESCAPES), None):
            return labels, f"invalid escape \\{bad} in the value of label {_quoted(name)}"
        if name in labels:
            return labels, f"label {_quoted(name)} given twice"
        labels[name] = _ESCAPE.sub(lambda m: _ESCAPES[m.group(1)], raw) if escapes else raw
        position = match.end()
        if position == len(text):
            return labels, None
        if text[position] != ",":
            return labels, "missing comma between labels"
        position += 1
        if not text[position:].strip(" \t"):  # a trailing comma is allowed
            return labels, None


def _value(text: str) -> tuple[float | None, str | None]:
    """A sample value, or the reason it is none. Non-finite only when spelled so."""
    try:
        value = float(text)
    except ValueError:
        return None, NOT_A_SAMPLE
    # Python's float also takes 1_000 and other scripts' digits, which the format does not
    if "_" in text or not text.isascii():
        return None, NOT_A_SAMPLE
    if not math.isfinite(value) and not _NON_FINITE.fullmatch(text):
        return None, f"value too large for a double: {_quoted(text)}"
    return value, None


def _bound(text: str) -> float | None:
    """A histogram bucket's upper bound: a finite number or +Inf (the last bucket)."""
    value, _ = _value(text)
    if value is None or math.isnan(value) or value == -math.inf:
        return None
    return value


def time_from_name(name: str) -> float | None:
    if match := _NAME_STAMP.search(name):
        try:
            return datetime(*(int(g) for g in match.groups()), tzinfo=UTC).timestamp()
        except ValueError:
            return None
    if match := _NAME_EPOCH_MS.search(name):
        return int(match.group(1)) / 1000.0
    if match := _NAME_EPOCH.search(name):
        return float(match.group(1))
    return None


def parse_snapshot(
    lines: list[str], first_line: int, name: str, mtime: float
) -> tuple[list[dict], list[dict]]:
    """(sample rows, rejects) of one scrape's lines."""
    samples: list[dict] = []
    rejects: list[dict] = []
    stamped: list[float] = []
    for offset, line in enumerate(lines):
        number = first_line + offset
        if len(line) > LINE_LIMIT:  # before any pattern looks at it: its cost is bounded
            reason = f"line longer than {LINE_LIMIT} characters"
            rejects.append({"line_number": number, "reason": reason, "raw": line.lstrip()[:RAW_LIMIT]})
            continue
        text = line.strip()
        if not text or text.startswith("#"):
            continue

        def reject(reason: str, number: int = number, text: str = text) -> None:
            rejects.append({"line_number": number, "reason": reason, "raw": text[:RAW_LIMIT]})

        match = _SAMPLE.match(text)
        if match is None:
            reject(NOT_A_SAMPLE)
            continue
        labels, problem = _labels(match.group("labels"))
        value, bad_value = _value(match.group("value"))
        if problem or bad_value:
            reject(problem or bad_value or NOT_A_SAMPLE)
            continue
        metric = match.group("name")
        if not metric.startswith(KEEP_PREFIXES):
            continue
        assert value is not None
        if not math.isfinite(value) and metric.endswith(_COUNTER_SUFFIXES):
            # the views turn these into deltas and sums: NaN or infinity would poison them
            reject(f"counter value is not a finite number: {_quoted(match.group('value'))}")
            continue
        le_text = labels.pop("le", None)
        le = _bound(le_text) if le_text is not None else None
        if le_text is not None and le is None:
            reject(f"bucket bound is not a number or +Inf: {_quoted(le_text)}")
            continue
        own = _stamp(match.group("ts")) if match.group("ts") else None
        if own is not None and not EPOCH_RANGE[0] <= own <= EPOCH_RANGE[1]:
            reject("sample timestamp out of range (epoch milliseconds expected)")
            continue
        if own is not None:
            stamped.append(own)
        samples.append(
            {
                "metric": metric,
                "labels": json.dumps(labels, sort_keys=True),
                "engine_label": labels.get("engine"),
                "model_name": labels.get("model_name"),
                "le": le,
                "value": value,
                "line_number": number,
                "ts": own,
            }
        )
    fallback = max(stamped) if stamped else (time_from_name(name) or mtime)
    for sample in samples:
        if sample["ts"] is None:
            sample["ts"] = fallback
    return samples, rejects
