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
"""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime

from hybridtrace.units import EPOCH_RANGE

RAW_LIMIT = 512
KEEP_PREFIXES = ("vllm:nixl_", "vllm:prompt_tokens_by_source", "agent_")

_SAMPLE = re.compile(
    r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+(?P<ts>-?\d+(?:\.\d+)?))?\s*$"
)
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_NAME_STAMP = re.compile(r"(20\d\d)-?(\d\d)-?(\d\d)[T_-]?(\d\d)[:-]?(\d\d)[:-]?(\d\d)")
_NAME_EPOCH = re.compile(r"(?<!\d)(1[5-9]\d{8})(?:\.\d+)?(?!\d)")
_NAME_EPOCH_MS = re.compile(r"(?<!\d)(1[5-9]\d{11})(?!\d)")
# Only these three are escapes in a label value; anything else stands for itself.
_ESCAPES = {"n": "\n", "\\": "\\", '"': '"'}
# A sample timestamp below this is in seconds (OpenMetrics); above, in milliseconds.
_SECONDS_BELOW = 1e11


def _stamp(text: str) -> float:
    value = float(text)
    return value if "." in text or abs(value) < _SECONDS_BELOW else value / 1000.0


def _labels(text: str | None) -> dict[str, str] | None:
    if not text:
        return {}
    labels: dict[str, str] = {}
    position = 0
    while position < len(text):
        match = _LABEL.match(text, position)
        if not match:
            return None
        labels[match.group(1)] = re.sub(
            r"\\(.)", lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), match.group(2)
        )
        position = match.end()
    return labels


def _value(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        lowered = text.lower()
        return {"+inf": math.inf, "-inf": -math.inf, "nan": math.nan}.get(lowered)


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
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        number = first_line + offset
        match = _SAMPLE.match(text)
        labels = _labels(match.group("labels")) if match else None
        value = _value(match.group("value")) if match else None
        if match is None or labels is None or value is None:
            rejects.append(
                {"line_number": number, "reason": "not a Prometheus sample line", "raw": text[:RAW_LIMIT]}
            )
            continue
        metric = match.group("name")
        if not metric.startswith(KEEP_PREFIXES):
            continue
        own = _stamp(match.group("ts")) if match.group("ts") else None
        if own is not None and not EPOCH_RANGE[0] <= own <= EPOCH_RANGE[1]:
            reason = "sample timestamp out of range (epoch milliseconds expected)"
            rejects.append({"line_number": number, "reason": reason, "raw": text[:RAW_LIMIT]})
            continue
        if own is not None:
            stamped.append(own)
        le = labels.pop("le", None)
        samples.append(
            {
                "metric": metric,
                "labels": json.dumps(labels, sort_keys=True),
                "engine_label": labels.get("engine"),
                "model_name": labels.get("model_name"),
                "le": _value(le) if le is not None else None,
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
