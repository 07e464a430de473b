"""A store writer killed in the middle of a commit, for the crash-safety tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hybridtrace.store import Store


def kill_writes(monkeypatch: pytest.MonkeyPatch, store: Store, crash_at: str) -> Callable[[], None]:
    """Make ``store``'s writes die: at its commit record when ``crash_at`` is "before the
    commit", else just after it (every deletion of superseded files fails). Returns what
    brings the writer back to life (the next process, in the tests' terms)."""
    original_write, original_delete = store.files.write_parquet, store.files.delete

    def write(table, rel):
        if crash_at == "before the commit" and rel.startswith("sources/part-"):
            raise OSError("killed")
        original_write(table, rel)

    def delete(rel):
        raise OSError("killed")

    monkeypatch.setattr(store.files, "write_parquet", write)
    monkeypatch.setattr(store.files, "delete", delete)

    def revive() -> None:
        monkeypatch.setattr(store.files, "write_parquet", original_write)
        monkeypatch.setattr(store.files, "delete", original_delete)

    return revive
