"""Sizes beyond which an input line is not read as data (docs/ingest.md, "Sizes").

No record of any format hybridtrace reads comes near them: a trace record is a few hundred
bytes, a scrape line a few hundred characters, a vLLM log message of interest a few KiB.
They bound the memory and time one malformed line can take, whatever its shape.
"""

from __future__ import annotations

# A connector trace line (bytes) or a Prometheus line (characters) longer than this is a
# reject; a vLLM log line is read up to it (the rest of a longer line is not looked at).
LINE_LIMIT = 1 << 20
