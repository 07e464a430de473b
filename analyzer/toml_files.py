"""A user's TOML file (a job file, hybridtrace.toml): read whole, every failure a UsageError."""

from __future__ import annotations

import tomllib
from pathlib import Path

from hybridtrace.errors import UsageError


def read_toml(path: Path, what: str) -> dict:
    """The parsed file; ``what`` names it in the message when it is missing ("job file")."""
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise UsageError(f"{path}: no such {what}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not a text file") from exc
    except OSError as exc:  # a folder, no permission
        raise UsageError(f"{path}: cannot read: {exc.strerror or exc}") from exc
