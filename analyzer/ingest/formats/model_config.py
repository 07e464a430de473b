"""A model's ``config.json`` (Hugging Face) as an input format, and the ``models`` row.

A config is one whole: read again when it changes, parsed once at the end. Its row is
built here only, for a config found in the input and for one given with ``--model``.
"""

from __future__ import annotations

import json
import time

import pyarrow as pa

from hybridtrace.ingest.formats.base import (
    Chunk,
    Format,
    Head,
    LastLine,
    ObjectContext,
    Parsed,
    Parser,
    Resume,
    WholeParser,
)


def read_config(data: bytes) -> tuple[dict | None, str, str]:
    """(config, its JSON text, "") from a config.json's bytes, or (None, "", why not)."""
    try:
        config = json.loads(data)
        text = json.dumps(config)
    except RecursionError:
        # Python's parser recurses per level: a config nested this deep is no model config
        return None, "", "nested too deeply to parse"
    except (ValueError, UnicodeDecodeError) as exc:
        return None, "", str(exc)
    if not isinstance(config, dict):
        return None, "", "not a JSON object"
    return config, text, ""


def architecture(config: dict) -> str | None:
    """The config's first architecture (or its model_type), when it is text."""
    listed = config.get("architectures")
    first = listed[0] if isinstance(listed, list) and listed else config.get("model_type")
    return first if isinstance(first, str) else None


def models_table(model: str, config: dict, text: str, origin: str, source_id: str,
                 applies_to: str | None = None) -> pa.Table:  # fmt: skip
    """The one ``models`` row of a config (``applies_to`` "*": given with ``--model``)."""
    return pa.table(
        {
            "model": [model],
            "architecture": [architecture(config)],
            "config": [text],
            "applies_to": pa.array([applies_to], pa.string()),
            "origin": [origin],
            "ingested_at": [time.time()],
            "source_id": [source_id],
            "line_number": [1],
        }
    )


def _json_object(text: bytes) -> dict | None:
    """``text`` parsed, when it is a JSON object Python's parser can read."""
    try:
        obj = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


class _ConfigParser(WholeParser):
    def parse_whole(self, chunk: Chunk) -> Parsed:
        parsed = Parsed()
        config, text, why = read_config(b"".join(block + b"\n" for block in self.blocks))
        if config is None:
            # an object that cannot be read: its row says why, and the run exits 2 (docs/ingest.md)
            parsed.reject([{"line_number": 0, "reason": f"config.json unreadable: {why}", "raw": ""}])
            parsed.error = why
            return parsed
        obj = self.context.obj
        name = config.get("_name_or_path") or (obj.folder if obj.name == "config.json" else obj.stem)
        # its origin is the object: the same object read again is a duplicate, not a second row
        parsed.add("models", models_table(str(name), config, text, obj.uri, chunk.source_id))
        return parsed


class ModelConfig(Format):
    name = "model_config"
    resume = Resume.WHOLE
    tables = ("models",)
    doc = "Model configs"

    def sniff(self, head: Head) -> bool:
        stripped = head.data.lstrip()
        if not stripped.startswith(b"{"):
            return False
        obj = _json_object(stripped)
        if obj is not None:
            return "architectures" in obj or "model_type" in obj
        # a config larger than the head looked at, or cut short
        return b'"architectures"' in stripped or b'"model_type"' in stripped

    def last_line(self, tail: bytes, quiet: bool) -> LastLine:
        return LastLine.TAKE  # a config is read whole: its last line is part of it either way

    def parser(self, context: ObjectContext) -> Parser:
        return _ConfigParser(context)
