"""Which engine an instance folder is: one rule for ingest (Python) and for the views (SQL).

vLLM logs and Prometheus scrapes carry no NIXL engine id until a log's `Initializing NIXL
worker` line names one, so a deployment is laid out one folder per instance, and an object
nothing in which names its engine is filed under its folder's name (``folder_engine_id``).
An instance is the folder's whole path: two runs' folders of the same name
(logs/0421/decode-0, logs/0422/decode-0) are two instances. Once a read of an instance
folder finds the engine's id, the folder is that engine: ``_instance_folders`` says which,
and how many ids other than the folder's name its reads found (a folder whose logs name
two engines is ambiguous, and the store renames nothing in it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import duckdb


class _InFolder(Protocol):
    @property
    def folder(self) -> str: ...

    @property
    def stem(self) -> str: ...


def folder_engine_id(obj: _InFolder) -> str:
    """The engine an object stands for when nothing in it names one: its folder, else its own stem."""
    return obj.folder or obj.stem


# An object's instance (the path of its folder) and folder (that folder's last name), from
# its manifest uri: the SQL twin of ObjectRef.folder.
INSTANCE_SQL = "regexp_extract(uri, '^(.*)/[^/]+$', 1)"
FOLDER_SQL = "regexp_extract(uri, '([^/]+)/[^/]+$', 1)"

# Every read of a vLLM log that filed its rows under an engine: the reads that name
# instance folders.
LOG_READS_SQL = (
    f"SELECT source_id, engine_id, {INSTANCE_SQL} AS instance, {FOLDER_SQL} AS folder "
    "FROM sources WHERE format = 'vllm_log' AND engine_id IS NOT NULL"
)

# Columns:
#   instance       path of the folder holding the objects
#   folder         its last name (what stores written before paths were kept call the instance)
#   engine_id      the NIXL engine id a log in that folder reported, else the folder's name
#   engines_named  how many engine ids other than the folder's name the folder's reads found
INSTANCE_FOLDERS_SQL = f"""
CREATE OR REPLACE VIEW _instance_folders AS
SELECT instance, folder,
       coalesce(max(engine_id) FILTER (WHERE engine_id <> folder), folder) AS engine_id,
       count(DISTINCT engine_id) FILTER (WHERE engine_id <> folder) AS engines_named
FROM ({LOG_READS_SQL})
GROUP BY instance, folder
"""


def install_instance_folders(con: duckdb.DuckDBPyConnection) -> None:
    """Create ``_instance_folders`` over the ``sources`` view of ``con``."""
    con.execute(INSTANCE_FOLDERS_SQL)
