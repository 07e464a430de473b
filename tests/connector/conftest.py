"""The connector tier: real NIXL agents and real vLLM 0.33 workers, in this process.

It needs vLLM and NIXL (``pip install ".[vllm]"`` and NIXL's wheels, see
docs/tracing-vllm.md). Without them the tier is not collected, so the README's test
command runs everywhere; CI sets ``HYBRIDTRACE_REQUIRE_CONNECTOR=1``, which turns a
missing package into a failure instead.
"""

import importlib.util
import os

# Before vLLM or NIXL is imported: this machine has no accelerator, UCX over TCP works on
# loopback (its shared-memory transport does not here), and vLLM's NIXL worker moves
# Mamba conv state only in the dim-first layout.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("UCX_TLS", "tcp,self")
os.environ.setdefault("VLLM_SSM_CONV_STATE_LAYOUT", "DS")

_missing = [name for name in ("vllm", "nixl") if importlib.util.find_spec(name) is None]
if _missing and os.environ.get("HYBRIDTRACE_REQUIRE_CONNECTOR") != "1":
    collect_ignore_glob = ["test_*.py"]
