"""Kept so that older imports work: the engine↔model tie is ``hybridtrace.store.engine_models``."""

from hybridtrace.store.engine_models import engine_models, register_engine_models  # noqa: F401
