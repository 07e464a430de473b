"""The code stays ruff-clean: a lint failure is a test failure."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed (pip install '.[test]')")
    command = [ruff, "check", "analyzer", "tests", "benchmarks"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_module_opens_with_what_it_holds():
    import ast

    missing = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "analyzer").rglob("*.py"))
               if not ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")))]  # fmt: skip
    assert missing == [], "modules without an opening docstring"


def test_every_subpackage_is_in_the_package_list():
    import tomllib

    packages = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(["hybridtrace", *p.parent.relative_to(ROOT / "analyzer").parts])
        for p in (ROOT / "analyzer").rglob("__init__.py")
    }
    assert found - packages == set(), "subpackages a non-editable install would leave out"
