"""The `planner` command line, a thin layer over the Python API (`planner/__init__.py`)."""
from planner.cli.app import app, main

__all__ = ["app", "main"]
