"""Errors the planner raises for bad user input.

Every message is one line that names the bad value and, where it helps, the
accepted ones, so the CLI can print it as is without a traceback.
"""


class PlannerError(ValueError):
    """Bad input to the planner: an unknown name, an impossible configuration."""
