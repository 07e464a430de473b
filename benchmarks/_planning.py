"""How much of an analysis is DuckDB planning its statements: binding and optimizing each one,
before any row is read. Used by ``analyze.py --incremental``.

A run of a few new requests reads little, and most of it is many small statements whose
plans cost more than their rows. DuckDB reports each statement's planning in its JSON
profile (``planner`` and ``optimizer`` timings); this wraps the connection an analysis gets,
reads the profile after each ``execute`` and sums them. The few queries an analysis makes as
relations (``con.sql``: reading its findings back, the link fits) are not counted: the sum is
a floor.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import duckdb


class PlanningTally:
    """A stand-in for a DuckDB connection that sums each statement's planning time."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        fd, self._profile = tempfile.mkstemp(suffix=".json", prefix="hybridtrace-plan-")
        os.close(fd)
        con.execute("PRAGMA enable_profiling = 'json'")
        con.execute(f"SET profiling_output = '{self._profile}'")
        con.execute("SET profiling_mode = 'detailed'")
        object.__setattr__(self, "_con", con)
        self.statements = 0  # statements DuckDB profiled (CREATE VIEW, DROP and the like are not)
        self.binding_s = 0.0
        self.optimizing_s = 0.0
        self.planning_s = 0.0  # binding, optimizing and the physical plan

    def _read_profile(self) -> None:
        try:
            with open(self._profile) as handle:
                profile = json.load(handle)
            os.truncate(self._profile, 0)
        except (OSError, ValueError):
            return  # nothing profiled since the last statement
        planner = profile.get("planner") or {}
        optimizer = profile.get("optimizer") or {}
        physical = profile.get("physical_planner") or {}
        self.statements += 1
        self.binding_s += planner.get("binding_time", 0.0)
        self.optimizing_s += optimizer.get("total_time", 0.0)
        parts = (planner, optimizer, physical)
        self.planning_s += sum(part.get("total_time", 0.0) for part in parts)

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        result = self._con.execute(*args, **kwargs)
        self._read_profile()
        return self if result is self._con else result

    def executemany(self, *args: Any, **kwargs: Any) -> Any:
        result = self._con.executemany(*args, **kwargs)
        self._read_profile()
        return self if result is self._con else result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)

    def close_profile(self) -> None:
        self._con.execute("PRAGMA disable_profiling")
        os.unlink(self._profile)
