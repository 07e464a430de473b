"""The SparkSession an ``--engine spark`` command runs on.

One of: a master URL (``local[2]``, ``spark://host:7077``, ``yarn``, ``k8s://…``), a Spark
Connect remote (``sc://host:15002``), or neither — then the session spark-submit or the
environment (``SPARK_REMOTE``, a notebook's active session) provides. ``spark.*`` settings
come from the job file's ``[spark]`` table or the caller.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hybridtrace.errors import UsageError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass
class SparkOptions:
    master: str | None = None  # --spark-master
    remote: str | None = None  # --spark-remote (Spark Connect)
    conf: dict[str, str] = field(default_factory=dict)  # spark.* settings
    app_name: str = "hybridtrace"

    def check(self) -> None:
        if self.master and self.remote:
            raise UsageError("--spark-master and --spark-remote: give one (a remote has its own master)")
        for key in self.conf:
            if not key.startswith("spark."):
                raise UsageError(f"[spark] {key}: Spark settings are named spark.*")


def spark_options(master: str | None = None, remote: str | None = None,
                  conf: Mapping[str, object] | None = None) -> SparkOptions:  # fmt: skip
    """Checked options; setting values are given to Spark as strings (TOML's true → "true")."""
    settings = {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in (conf or {}).items()}
    options = SparkOptions(master, remote, settings)
    options.check()
    return options


def _flatten(table: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def job_spark_options(table: object, where: str) -> SparkOptions:
    """The job file's ``[spark]`` table: ``master`` or ``remote``, and ``spark.*`` settings
    written as TOML dotted keys (``spark.executor.memory = "4g"``) or quoted ones."""
    if not isinstance(table, Mapping):
        raise UsageError(f"{where}: [spark] must be a table")
    settings = _flatten(table)
    master, remote = settings.pop("master", None), settings.pop("remote", None)
    for key, value in (("master", master), ("remote", remote)):
        if value is not None and not isinstance(value, str):
            raise UsageError(f"{where}: [spark] {key} must be a string, not {value!r}")
    for key, value in settings.items():
        if not key.startswith("spark."):
            raise UsageError(f"{where}: [spark] {key}: known keys are master, remote and spark.* settings")
        if not isinstance(value, (str, int, float, bool)):
            raise UsageError(f"{where}: [spark] {key} must be a string, number or true/false")
    try:
        return spark_options(master, remote, settings)  # type: ignore[arg-type]
    except UsageError as exc:
        raise UsageError(f"{where}: {exc}") from None


def open_session(options: SparkOptions) -> SparkSession:
    """The session (an existing one with the same master is reused, as Spark does)."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise UsageError(
            '--engine spark needs PySpark: pip install "hybridtrace[spark]" (and a Java 17 runtime)'
        ) from None
    builder = SparkSession.builder.appName(options.app_name)
    if options.remote:
        builder = builder.remote(options.remote)
    elif options.master:
        builder = builder.master(options.master)
        if options.master.startswith("local") and "PYSPARK_PYTHON" not in os.environ:
            # local mode's Python workers are this interpreter, so they import this install
            # (PySpark reads only the environment for them, not spark.pyspark.python)
            os.environ["PYSPARK_PYTHON"] = sys.executable
    if not options.remote:  # a Connect server's settings are its own
        # the progress bar would be drawn over the command's own output
        builder = builder.config("spark.ui.showConsoleProgress", "false")
    for key, value in options.conf.items():
        builder = builder.config(key, value)
    try:
        return builder.getOrCreate()
    except Exception as exc:  # no Java, a remote that does not answer, a bad setting
        where = options.remote or options.master or "the default master"
        first = str(exc).strip().splitlines()
        raise UsageError(f"cannot start Spark ({where}): {first[0] if first else repr(exc)}") from exc
