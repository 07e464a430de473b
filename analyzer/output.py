"""One way to print results, shared by every command: table, JSON or CSV.

Commands build plain rows (lists of dicts) or one JSON-able object and hand them here,
so ``--format`` means the same thing everywhere.
"""

from __future__ import annotations

import csv
import decimal
import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any

from hybridtrace.errors import UsageError
from hybridtrace.units import format_bytes


class OutputFormat(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


def _json_default(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, decimal.Decimal):
        # exact decimals keep every digit: a float would round them
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    # UUIDs, intervals and the like: their text is what a reader wants
    return str(value)


def _clean(value: Any) -> Any:
    # JSON has no NaN or infinity: an undefined number is null, never a silent 0.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def to_json(obj: Any, *, indent: int | None = 2) -> str:
    return json.dumps(_clean(obj), indent=indent, default=_json_default, ensure_ascii=False)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)  # inf, -inf, nan: a value, not a missing one
        return f"{value:.6g}" if abs(value) < 1e6 else f"{value:.0f}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=_json_default)
    return str(value)


def to_csv(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    columns = list(columns or _columns(rows))
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if row.get(c) is None else _csv_value(row.get(c)) for c in columns])
    return buffer.getvalue()


def _csv_value(value: Any) -> Any:
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=_json_default)
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    return value


def _columns(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for row in rows:
        for key in row:
            seen.setdefault(key, None)
    return list(seen)


def to_table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str] | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    right_align: Iterable[str] | None = None,
) -> str:
    """Fixed-width text table; numbers right-aligned unless told otherwise."""
    columns = list(columns or _columns(rows))
    headers = dict(headers or {})
    titles = [headers.get(c, c) for c in columns]
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    if right_align is None:
        numeric = {
            c
            for c in columns
            if rows and all(isinstance(r.get(c), (int, float)) or r.get(c) is None for r in rows)
        }
    else:
        numeric = set(right_align)
    widths = [max([len(t)] + [len(r[i]) for r in cells]) for i, t in enumerate(titles)]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if c in numeric else v.ljust(w)
            for v, w, c in zip(values, widths, columns, strict=True)
        ]
        return "  ".join(parts).rstrip()

    out = [line(titles), line(["-" * w for w in widths])]
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def bytes_cell(value: int | float | None) -> str | None:
    """A byte count for a text table: the exact integer, its binary size beside it from 1 KiB.

    ``12,582,912 (12.00 MiB)``; ``512`` alone. Only tables carry the human figure: JSON and
    CSV keep the integer, for scripts.
    """
    if value is None:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    exact = f"{int(value):,}" if float(value).is_integer() else f"{value:,}"
    return exact if abs(value) < 1024 else f"{exact} ({format_bytes(value)})"


def bytes_text(value: int | float | None) -> str:
    """A byte count in running text: ``12,582,912 B (12.00 MiB)``, a dash for none."""
    if value is None:
        return "-"
    cell = bytes_cell(value)
    return cell.replace(" (", " B (", 1) if "(" in cell else f"{cell} B"


def to_pairs(pairs: Sequence[tuple[str, str]]) -> str:
    """``label  value`` lines with labels padded to one width."""
    if not pairs:
        return ""
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in pairs)


def render_rows(
    rows: Sequence[Mapping[str, Any]],
    fmt: OutputFormat | str,
    columns: Sequence[str] | None = None,
) -> str:
    fmt = OutputFormat(fmt)
    if fmt is OutputFormat.json:
        return to_json(list(rows))
    if fmt is OutputFormat.csv:
        return to_csv(rows, columns).rstrip("\n")
    if not rows:
        return "(no rows)"
    return to_table(rows, columns)


def parse_format(value: str, allowed: Sequence[str] = ("table", "json", "csv")) -> OutputFormat:
    if value not in allowed:
        raise UsageError(f"--format must be one of {', '.join(allowed)}; got {value!r}")
    return OutputFormat(value)
