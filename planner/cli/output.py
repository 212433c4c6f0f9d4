"""What every `planner` command does with bad input: one line on stderr, exit code 2."""
from __future__ import annotations

import typer


def fail(message: str) -> typer.Exit:
    """Print ``error: message`` (first line only) on stderr; the caller raises the returned Exit."""
    typer.echo(f"error: {message.splitlines()[0] if message else 'invalid input'}", err=True)
    return typer.Exit(2)
