"""Errors a user can act on. The CLI prints their message and exits 2, no traceback."""

from __future__ import annotations


class HybridtraceError(Exception):
    """Base class: something about the input or the invocation is wrong."""

    exit_code = 2


class UsageError(HybridtraceError):
    """An option or argument cannot be used as given."""


class ConfigError(HybridtraceError):
    """A model config.json is unreadable or describes a model we cannot size."""


class UnsupportedArchitecture(ConfigError):
    """The config names an architecture the byte model does not know."""


class StoreWriteError(HybridtraceError):
    """The store could not be written (disk full, a bucket refusing an upload): the run stops."""


class StoreDamagedError(HybridtraceError):
    """The store's manifest lists data whose files are gone: reading on would answer from less."""
