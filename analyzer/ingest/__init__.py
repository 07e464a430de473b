"""``hybridtrace ingest``: inputs into the store. ``run.py`` is the entry point (``ingest()``);
``formats/`` holds one module per input format (docs/architecture.md, "Adding an input format")."""
