"""Parse and print the quantities operators type: sizes, rates and durations.

Conventions follow the contract: KiB/MiB/GiB are powers of two, KB/MB/GB powers of
ten, GB/s is 10^9 bytes per second, and a bare number means bytes, bytes per second
or seconds. Lower-case ``b`` means bits (``Gb/s``, ``Gbps``), as network people
write it.
"""

from __future__ import annotations

import math
import re

from hybridtrace.errors import UsageError

_SIZE_FACTORS: dict[str, float] = {
    "": 1,
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "k": 1e3,
    "kb": 1e3,
    "m": 1e6,
    "mb": 1e6,
    "g": 1e9,
    "gb": 1e9,
    "t": 1e12,
    "tb": 1e12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}

# Bit units: only recognised with the exact lower-case "b" (Gb/s), so "GB/s" stays bytes.
_BIT_FACTORS: dict[str, float] = {
    "kb": 1e3 / 8,
    "mb": 1e6 / 8,
    "gb": 1e9 / 8,
    "tb": 1e12 / 8,
    "kbit": 1e3 / 8,
    "mbit": 1e6 / 8,
    "gbit": 1e9 / 8,
    "tbit": 1e12 / 8,
}

_DURATION_FACTORS: dict[str, float] = {
    "": 1.0,
    "s": 1.0,
    "sec": 1.0,
    "ms": 1e-3,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ns": 1e-9,
    "min": 60.0,
}

_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-zµμ]*)\s*$")

# Epoch seconds an input can carry: 2000-01-01 to 2100-01-01 UTC. A time written in
# milliseconds (or nanoseconds) is a reject, not a date thousands of years away.
EPOCH_RANGE = (946_684_800.0, 4_102_444_800.0)


def _split(text: str, what: str) -> tuple[float, str]:
    match = _QUANTITY.match(text.replace("_", "").replace(",", ""))
    if not match:
        raise UsageError(f"cannot read {text!r} as {what}")
    value = float(match.group(1))
    if not math.isfinite(value):  # 1e400 reads as infinity
        raise UsageError(f"{text!r} is too large for {what}")
    return value, match.group(2)


def parse_size(text: str | int | float) -> float:
    """Bytes in ``text`` (``4KiB``, ``2.57MiB``, ``1.5GB``, ``4096``); may be fractional."""
    if isinstance(text, (int, float)):
        return float(text)
    value, unit = _split(text, "a size")
    factor = _SIZE_FACTORS.get(unit.lower())
    if factor is None:
        raise UsageError(f"unknown size unit {unit!r} in {text!r} (use B, KiB, MiB, GiB, KB, MB, GB)")
    return value * factor


def parse_bytes(text: str | int | float) -> int:
    """Whole bytes in ``text``; a fractional result (``2.57MiB``) is rounded to nearest."""
    return round(parse_size(text))


def parse_rate(text: str | int | float) -> float:
    """Bytes per second in ``text`` (``20GB/s``, ``25GiB/s``, ``400Gb/s``, ``100Gbps``)."""
    if isinstance(text, (int, float)):
        return float(text)
    raw = text.strip()
    lowered = raw.lower()
    if lowered.endswith("ps") and not lowered.endswith("/ps"):
        # 100Gbps / 100GBps: "ps" means per second; the case of the b decides bits or bytes.
        raw = raw[:-2] + "/s"
    if not raw.lower().endswith("/s"):
        raise UsageError(f"cannot read {text!r} as a rate (write it like 20GB/s or 400Gb/s)")
    body = raw[:-2]
    value, unit = _split(body, "a rate")
    is_bits = unit.lower().endswith("bit") or (unit.endswith("b") and not unit.endswith("ib"))
    factor = _BIT_FACTORS.get(unit.lower()) if is_bits else _SIZE_FACTORS.get(unit.lower())
    if factor is None:
        raise UsageError(f"unknown rate unit {unit!r} in {text!r}")
    rate = value * factor
    if rate <= 0:
        raise UsageError(f"a rate must be positive, got {text!r}")
    return rate


def parse_duration(text: str | int | float) -> float:
    """Seconds in ``text`` (``80us``, ``1.5ms``, ``2s``, ``250ns``)."""
    if isinstance(text, (int, float)):
        return float(text)
    value, unit = _split(text, "a duration")
    factor = _DURATION_FACTORS.get(unit.lower() if unit not in ("µs", "μs") else unit)
    if factor is None:
        raise UsageError(f"unknown duration unit {unit!r} in {text!r} (use s, ms, us, ns)")
    return value * factor


def parse_int_list(text: str) -> list[int]:
    """``512,4096,32K`` → ``[512, 4096, 32000]``; ``32Ki`` style binary suffixes are allowed."""
    values: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        match = re.fullmatch(r"([0-9]+)\s*([kKmM]i?)?", part)
        if not match:
            raise UsageError(f"cannot read {part!r} as a whole number")
        number = int(match.group(1))
        suffix = (match.group(2) or "").lower()
        number *= {"": 1, "k": 1000, "ki": 1024, "m": 1_000_000, "mi": 1 << 20}[suffix]
        values.append(number)
    if not values:
        raise UsageError(f"no numbers in {text!r}")
    return values


def format_bytes(value: float | int | None) -> str:
    """A human figure with binary units: ``4.57 MiB``; exact bytes under 1 KiB."""
    if value is None:
        return "-"
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    magnitude = abs(value)
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if magnitude >= factor:
            return f"{value / factor:.2f} {unit}"
    return f"{value:.0f} B"


def format_duration(seconds: float | None) -> str:
    """``0.32 ms``, ``6.93 ms``, ``1.20 s``, ``80.0 us``."""
    if seconds is None:
        return "-"
    magnitude = abs(seconds)
    if magnitude >= 1:
        return f"{seconds:.2f} s"
    if magnitude >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def format_rate(bytes_per_s: float | None) -> str:
    """Decimal GB/s, as link vendors and the contract state bandwidth."""
    if bytes_per_s is None:
        return "-"
    return f"{bytes_per_s / 1e9:.2f} GB/s"
