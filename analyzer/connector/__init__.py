"""What runs inside vLLM's processes: the trace writer and the record builders.

This package is a guest in the engine. It imports the standard library only (orjson when
it is installed), never raises into its host, never blocks the engine's thread, and says
once, through the ``hybridtrace.connector`` logger, when it cannot see what it needs.
``hybridtrace.connector.vllm`` is the NIXL connector that uses it.
"""

from hybridtrace.connector.writer import TraceWriter, trace_dir

__all__ = ["TraceWriter", "trace_dir"]
