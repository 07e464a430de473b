"""The input formats hybridtrace reads, one module each, and the order detection asks them in.

Adding a format is one new module with a ``Format`` subclass (``base.py`` says what it
declares) and one entry in ``REGISTRY``; ``docs/architecture.md`` ("Adding an input
format") has the checklist, and ``tests/test_format_plugins.py`` checks it is complete.
"""

from __future__ import annotations

from hybridtrace.ingest.formats.agent_map import AgentMap
from hybridtrace.ingest.formats.base import Format, Head, Resume
from hybridtrace.ingest.formats.connector_trace import ConnectorTrace
from hybridtrace.ingest.formats.model_config import ModelConfig
from hybridtrace.ingest.formats.nixl_ring import NixlRing
from hybridtrace.ingest.formats.nixlbench import Nixlbench
from hybridtrace.ingest.formats.prometheus import Prometheus
from hybridtrace.ingest.formats.sglang import Sglang
from hybridtrace.ingest.formats.trtllm_csv import TrtllmCsv
from hybridtrace.ingest.formats.vllm_log import VllmLog

# Precedence: the first format whose sniff takes an object reads it. A binary format
# (Resume.NONE) is asked first, on the raw bytes; then a trace (its records are JSON, as
# a config is, but a config is one object), a config, the other engines by their own
# markers (an SGLang log has vLLM-like lines), a user's agent map and nixlbench's output by
# theirs, a vLLM log, a scrape.
REGISTRY: list[Format] = [
    NixlRing(),
    ConnectorTrace(),
    ModelConfig(),
    AgentMap(),
    TrtllmCsv(),
    Sglang(),
    Nixlbench(),
    VllmLog(),
    Prometheus(),
]

# What `sources.format` says of an object no format took, or one with nothing in it.
UNKNOWN = "unknown"
EMPTY = "empty"


def register(fmt: Format, before: str | None = None) -> None:
    """Add ``fmt`` to the registry, last or just before the format called ``before``."""
    if by_name(fmt.name) is not None or fmt.name in (UNKNOWN, EMPTY):
        raise ValueError(f"a format called {fmt.name!r} is registered already")
    names = [f.name for f in REGISTRY]
    REGISTRY.insert(names.index(before) if before is not None else len(REGISTRY), fmt)


def by_name(name: str | None) -> Format | None:
    """The registered format called ``name`` (None for unknown, empty or an old name)."""
    return next((fmt for fmt in REGISTRY if fmt.name == name), None)


def detect_binary(head: bytes, name: str, size: int) -> Format | None:
    """The binary format (read whole, never in lines) an object's raw first bytes are, if any."""
    sniffed = Head(head, name, size)
    return next((f for f in REGISTRY if f.resume is Resume.NONE and f.sniff(sniffed)), None)


def detect_text(head: bytes, name: str = "", size: int = 0) -> Format | None:
    """The text format whose object starts with ``head`` (gunzipped), if any."""
    sniffed = Head(head, name, size)
    return next((f for f in REGISTRY if f.resume is not Resume.NONE and f.sniff(sniffed)), None)
