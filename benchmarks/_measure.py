"""Shared by the benchmarks: run code in a fresh interpreter, time it, and read its peak memory."""

from __future__ import annotations

import compileall
import importlib.util
import subprocess
import sys

_COMPILED = False


def compile_package() -> None:
    """Byte-compile the hybridtrace the children import, once, as ``pip install`` does.

    An editable install (``pip install -e``) leaves its modules uncompiled, and where
    PYTHONDONTWRITEBYTECODE is set (as on the machines these benchmarks run on) the import
    system never writes their bytecode: every timed child would then compile each module it
    imports again, a tenth of a second a run that no installed copy pays, and all of it on
    hybridtrace's side of each ratio (the baselines import installed packages, compiled when
    they were installed). Compiling writes the files whatever that setting says.
    """
    global _COMPILED
    if _COMPILED:
        return
    spec = importlib.util.find_spec("hybridtrace")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        compileall.compile_dir(folder, quiet=1)
    _COMPILED = True


def run_timed(code: str) -> tuple[float, int, str]:
    """Seconds, peak RSS (bytes) and the last line ``code`` printed, in a fresh interpreter,
    with hybridtrace's modules compiled as an install leaves them (``compile_package``).

    Peak memory comes from GNU time's report of the child alone: a child's own getrusage
    would carry over the high-water mark of the (generating) parent.
    """
    compile_package()
    wrapper = f"import time\nt = time.perf_counter()\n{code}\nprint(time.perf_counter() - t)\n"
    out = subprocess.run(
        ["/usr/bin/time", "-f", "maxrss_kb=%M", sys.executable, "-c", wrapper],
        check=True,
        capture_output=True,
        text=True,
    )
    lines = out.stdout.strip().splitlines()
    rss_kb = int(out.stderr.strip().rsplit("maxrss_kb=", 1)[1].split()[0])
    return float(lines[-1]), rss_kb * 1024, lines[-2] if len(lines) > 1 else ""
