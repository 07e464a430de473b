"""The text each command prints for ``--format table``: one module per command's result.

The CLI turns options into a library call and hands the result here; JSON and CSV go
through ``hybridtrace.output`` unchanged. Byte counts shown as integers carry their
human size beside them (``bytes_cell``), as binary units.
"""
