"""`python -m hybridtrace`: the command line, as the `hybridtrace` script runs it."""

from hybridtrace.cli import main

main()
