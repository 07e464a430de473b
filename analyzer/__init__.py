"""hybridtrace: per-request, per-rank byte accounting of hybrid-model KV transfers."""

__version__ = "0.1.0"
