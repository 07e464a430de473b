from hybridtrace.cli import main

main()
