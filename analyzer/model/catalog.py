"""Real model configs shipped with hybridtrace, so a model can be named instead of found.

``hybridtrace model nemotron-nano-12b-v2`` reads the packaged copy of that model's
Hugging Face config.json. Names are matched without case; the Hugging Face id works too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from hybridtrace.errors import ConfigError


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    hf_id: str
    filename: str


CATALOG: tuple[CatalogEntry, ...] = (
    CatalogEntry("nemotron-nano-12b-v2", "nvidia/NVIDIA-Nemotron-Nano-12B-v2", "nemotron-nano-12b-v2.json"),
    CatalogEntry(
        "nemotron-3-nano-30b-a3b",
        "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
        "nemotron-3-nano-30b-a3b.json",
    ),
    CatalogEntry("nemotron-h-8b-base-8k", "nvidia/Nemotron-H-8B-Base-8K", "nemotron-h-8b-base-8k.json"),
    CatalogEntry("jamba-v0.1", "ai21labs/Jamba-v0.1", "jamba-v0.1.json"),
    CatalogEntry(
        "qwen3-next-80b-a3b-instruct", "Qwen/Qwen3-Next-80B-A3B-Instruct", "qwen3-next-80b-a3b-instruct.json"
    ),
    CatalogEntry("zamba2-7b", "Zyphra/Zamba2-7B", "zamba2-7b.json"),
    CatalogEntry("mamba-codestral-7b", "mistralai/Mamba-Codestral-7B-v0.1", "mamba-codestral-7b.json"),
    CatalogEntry("mamba-130m", "state-spaces/mamba-130m-hf", "mamba-130m.json"),
    CatalogEntry("mamba-2.8b", "state-spaces/mamba-2.8b-hf", "mamba-2.8b.json"),
    CatalogEntry("falcon-mamba-7b", "tiiuae/falcon-mamba-7b", "falcon-mamba-7b.json"),
    CatalogEntry("llama-3-8b-instruct", "meta-llama/Meta-Llama-3-8B-Instruct", "llama-3-8b-instruct.json"),
    CatalogEntry(
        "ministral-8b-instruct-2410",
        "mistralai/Ministral-8B-Instruct-2410",
        "ministral-8b-instruct-2410.json",
    ),
)

DEFAULT_MODEL = "nemotron-nano-12b-v2"


def _lookup(name: str) -> CatalogEntry | None:
    wanted = name.strip().lower()
    for entry in CATALOG:
        if wanted in (entry.name, entry.hf_id.lower(), entry.hf_id.split("/")[-1].lower()):
            return entry
    return None


def builtin_names() -> list[str]:
    return [entry.name for entry in CATALOG]


def read_builtin(name: str) -> tuple[dict[str, Any], CatalogEntry] | None:
    entry = _lookup(name)
    if entry is None:
        return None
    text = resources.files("hybridtrace.model.configs").joinpath(entry.filename).read_text(encoding="utf-8")
    return json.loads(text), entry


def load_config(source: str | Path) -> tuple[dict[str, Any], str]:
    """(config, model name) from a config.json path, a folder holding one, or a built-in name."""
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{path}: not a readable config.json ({exc})") from exc
        except RecursionError:
            # Python's parser recurses per level of nesting: no model config is this deep
            raise ConfigError(f"{path}: not a readable config.json (nested too deeply)") from None
        if not isinstance(config, dict):
            raise ConfigError(f"{path}: config.json must hold a JSON object")
        name = config.get("_name_or_path") or (path.parent.name if path.name == "config.json" else path.stem)
        return config, str(name)
    builtin = read_builtin(str(source))
    if builtin is not None:
        config, entry = builtin
        return config, entry.hf_id
    raise ConfigError(
        f"{source}: no such file, and not a built-in model (built-in: {', '.join(builtin_names())})"
    )
