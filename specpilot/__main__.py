"""`python -m specpilot`: the same command line as the `specpilot` console script."""

from specpilot.cli import main

main()
