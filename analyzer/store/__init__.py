"""The store: Parquet files per table, a ``sources`` manifest as commit record, views over both.

Its modules, by what they hold:

- ``commit.py``: the ``Store`` (layout, schema version, writer lock) and its commit
  protocol: write a batch, recover from a killed one, compact many small ones;
- ``roots.py``: where the files live, a local folder or a bucket prefix (temporary name,
  fsync, rename; or one whole upload);
- ``leases.py``: one writer at a time, by a file lock or a bucket lease;
- ``objects.py``: local files and S3/GCS objects behind one ``ObjectRef`` (listing, ranged
  reads, versions), bucket locations and credentials kept out of URIs;
- ``keys.py``: which rows the store already holds (dedupe by table key);
- ``raw_views.py``: a DuckDB connection with one view per table over committed files;
- ``instances.py``: which engine an instance folder is;
- ``engine_settings.py``: an engine's newest settings (``_engine_newest``);
- ``engine_models.py``: the engine↔model tie, each engine sized at its TP;
- ``analysis.py``: ``open_analysis``, the one way the commands get a connection;
- ``publish.py``: writing a finished file (a report) to a path or a bucket at once.
"""

from __future__ import annotations

from hybridtrace.store.analysis import NoStoreError, open_analysis
from hybridtrace.store.commit import DEFAULT_STORE, Store, concat, default_store, new_batch_id
from hybridtrace.store.keys import dedupe
from hybridtrace.store.raw_views import CUT_RECORD

__all__ = [
    "CUT_RECORD",
    "DEFAULT_STORE",
    "NoStoreError",
    "Store",
    "concat",
    "dedupe",
    "default_store",
    "new_batch_id",
    "open_analysis",
]
