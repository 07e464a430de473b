"""nixlbench's text output → calibration points for a link.

nixlbench prints its configuration (``<description, padded>: <value>`` lines between rows
of 160 ``*``), then a fixed-width table: a header, a row of 160 ``-``, one row per
(block size, batch size). Its columns: block size (B), batch size (descriptors per
request), B/W (decimal GB/s), average latency per block (µs), average and P99 prepare,
post and transfer times (µs; "Tx" runs from the post's return to completion, so NIXL's
own transfer time is post + Tx). Pairwise runs over more than two ranks add an aggregate
bandwidth and a network-utilisation column after B/W. Columns are found by their
headers, so either table reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_RULE = re.compile(r"^\s*[-*]{40,}\s*$")
_CONFIG = re.compile(r"^(?P<key>.+?)\s*:\s(?P<value>.*)$")
_OPTION = re.compile(r"--(\w+)")
# header text → field; the table has no other names for them
_COLUMNS = {
    "Block Size (B)": "block_bytes",
    "Batch Size": "batch_size",
    "B/W (GB/Sec)": "gb_per_s",
    "Aggregate B/W (GB/Sec)": "aggregate_gb_per_s",
    "Network Util (%)": "network_util_pct",
    "Avg Lat. (us)": "avg_latency_us",
    "Avg Prep (us)": "avg_prep_us",
    "P99 Prep (us)": "p99_prep_us",
    "Avg Post (us)": "avg_post_us",
    "P99 Post (us)": "p99_post_us",
    "Avg Tx (us)": "avg_tx_us",
    "P99 Tx (us)": "p99_tx_us",
}
_INTEGER = {"block_bytes", "batch_size"}


@dataclass
class Bench:
    config: dict[str, str] = field(default_factory=dict)  # option name (backend, op_type, …) → value
    rows: list[dict] = field(default_factory=list)
    rejects: list[tuple[int, str, str]] = field(default_factory=list)  # (line number, reason, text)


def looks_like_nixlbench(head: bytes) -> bool:
    return b"NIXLBench Configuration" in head[:8192] or b"Block Size (B)" in head[:65536]


def parse_nixlbench(text: str) -> Bench:
    """Configuration and table rows of one nixlbench run; a row that does not read is a reject."""
    bench = Bench()
    header: list[tuple[str, int]] | None = None
    in_table = False
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if _RULE.match(line):
            in_table = header is not None
            continue
        if "Block Size (B)" in line:
            header = _header(line)
            in_table = False
            continue
        if in_table and header is not None:
            row = _row(line, header)
            if isinstance(row, str):
                bench.rejects.append((number, row, line[:512]))
            else:
                bench.rows.append({**row, "line_number": number})
            continue
        match = _CONFIG.match(line)
        if match and header is None:
            option = _OPTION.search(match["key"])
            key = option.group(1) if option else match["key"].strip().lower().replace(" ", "_")
            bench.config[key] = match["value"].strip()
    return bench


def _header(line: str) -> list[tuple[str, int]]:
    """(field, column index) of the known headers, in the order they appear."""
    found = []
    for text, name in _COLUMNS.items():
        # "B/W (GB/Sec)" also ends "Aggregate B/W (GB/Sec)": match it only on its own
        pattern = ("(?<!Aggregate )" if text == "B/W (GB/Sec)" else "") + re.escape(text)
        match = re.search(pattern, line)
        if match:
            found.append((match.start(), name))
    return [(name, i) for i, (_, name) in enumerate(sorted(found))]


def _row(line: str, header: list[tuple[str, int]]) -> dict | str:
    cells = line.split()
    if len(cells) != len(header):
        return f"{len(cells)} values for {len(header)} columns"
    row: dict = {}
    for name, index in header:
        try:
            value = float(cells[index])
        except ValueError:
            return f"{name} is not a number: {cells[index]!r}"
        if value != value or value in (float("inf"), float("-inf")) or value < 0:
            return f"{name} out of range: {cells[index]}"
        row[name] = int(value) if name in _INTEGER else value
    return row
