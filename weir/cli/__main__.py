"""`python -m weir.cli`: the `weir` command, for a process started with a given interpreter."""

from weir.cli import main

main()
