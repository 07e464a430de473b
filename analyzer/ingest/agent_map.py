"""A user-given map of NIXL agents to engine and rank: a small CSV or TOML file.

vLLM names NIXL agents with random UUIDs; the connector's engine records say which agent
is which engine's rank. Where no connector runs, an operator can say it in a file among
the inputs, in either shape (``docs/ingest.md``, "Agent maps")::

    agent_name,engine_id,rank
    3f2a0c1e-…,decode-0,0

    [agents]
    "3f2a0c1e-…" = { engine_id = "decode-0", rank = 0 }
    "91c0aa7b-…" = "prefill-0"          # the rank left unknown
"""

from __future__ import annotations

import csv
import io
import re
import tomllib

RAW_LIMIT = 512
_INT32_MAX = 2**31 - 1
_TOML_HEAD = re.compile(rb"^\s*\[agents(?:\]|\.)", re.M)


def looks_like_agent_map(head: bytes) -> bool:
    lines = (line for line in head.splitlines() if line.strip() and not line.lstrip().startswith(b"#"))
    first = next(lines, b"")
    fields = {f.strip().strip(b'"').lower() for f in first.split(b",")}
    if {b"agent_name", b"engine_id"} <= fields and fields <= {b"agent_name", b"engine_id", b"rank"}:
        return True
    return _TOML_HEAD.search(head[:65536]) is not None


def _rank(value: object) -> tuple[int | None, str | None]:
    if value is None or value == "":
        return None, None
    if isinstance(value, bool):
        return None, "rank is not a whole number"
    if isinstance(value, int):
        number = value
    else:
        text = str(value).strip()
        if not re.fullmatch(r"\d{1,10}", text):
            return None, "rank is not a whole number"
        number = int(text)
    if not 0 <= number <= _INT32_MAX:
        return None, "rank is out of range"
    return number, None


def parse_agent_map(data: bytes) -> tuple[list[dict], list[tuple[int, str, str]], str | None]:
    """(agent_name, engine_id, rank, line_number) entries, rejects, and why the file cannot be read."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return [], [], f"agent map unreadable: not UTF-8 ({exc.reason} at byte {exc.start})"
    if _TOML_HEAD.search(data[:65536]):
        return _parse_toml(text)
    return _parse_csv(text)


def _entry(agent: object, engine: object, rank: object, number: int, raw: str,
           rows: list[dict], rejects: list[tuple[int, str, str]]) -> None:  # fmt: skip
    agent_name = str(agent).strip() if agent is not None else ""
    engine_id = str(engine).strip() if engine is not None else ""
    if not agent_name or not engine_id:
        rejects.append((number, "agent map entry without agent_name or engine_id", raw[:RAW_LIMIT]))
        return
    value, why = _rank(rank)
    if why:
        rejects.append((number, f"agent map entry whose {why}", raw[:RAW_LIMIT]))
        return
    rows.append({"agent_name": agent_name, "engine_id": engine_id, "rank": value, "line_number": number})


def _parse_csv(text: str) -> tuple[list[dict], list[tuple[int, str, str]], str | None]:
    rows: list[dict] = []
    rejects: list[tuple[int, str, str]] = []
    lines = text.splitlines()
    reader = csv.reader(io.StringIO(text))
    header: list[str] | None = None
    for cells in reader:
        number = reader.line_num
        raw = lines[number - 1] if 0 < number <= len(lines) else ""
        if not any(c.strip() for c in cells) or raw.lstrip().startswith("#"):
            continue
        if header is None:
            header = [c.strip().lower() for c in cells]
            continue
        if len(cells) != len(header):
            rejects.append((number, f"agent map row of {len(cells)} fields, the header has {len(header)}",
                            raw[:RAW_LIMIT]))  # fmt: skip
            continue
        record = dict(zip(header, cells, strict=True))
        agent, engine, rank = record.get("agent_name"), record.get("engine_id"), record.get("rank")
        _entry(agent, engine, rank, number, raw, rows, rejects)
    return rows, rejects, None


def _parse_toml(text: str) -> tuple[list[dict], list[tuple[int, str, str]], str | None]:
    try:
        doc = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        return [], [], f"agent map unreadable: {exc}"
    agents = doc.get("agents")
    if not isinstance(agents, dict):
        return [], [], "agent map unreadable: its [agents] is not a table"
    lines = text.splitlines()
    rows: list[dict] = []
    rejects: list[tuple[int, str, str]] = []
    for agent, value in agents.items():
        # the line that names the agent, for the row's line number
        number = next((i for i, line in enumerate(lines, 1) if agent in line), 0)
        raw = lines[number - 1] if number else agent
        if isinstance(value, str):
            _entry(agent, value, None, number, raw, rows, rejects)
        elif isinstance(value, dict):
            _entry(agent, value.get("engine_id"), value.get("rank"), number, raw, rows, rejects)
        else:
            why = "agent map entry that is neither an engine id nor a table"
            rejects.append((number, why, raw[:RAW_LIMIT]))
    return rows, rejects, None
