"""The `specpilot` command line: one thin sub-command per user verb.

Each area registers its commands here; the work lives in the area's own module. Errors a
user can act on (SpecPilotError) print as one line and exit 2, never as a traceback.
"""

from __future__ import annotations

import sys

import typer

from .runtime.errors import SpecPilotError

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


@app.command()
def version() -> None:
    """Print the SpecPilot version."""
    from specpilot import __version__

    print(__version__)


def main() -> None:
    try:
        app()
    except SpecPilotError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
