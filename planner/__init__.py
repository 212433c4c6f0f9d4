"""A capacity planner for LLM serving on a paged (PagedAttention) engine.

    from planner import Deployment, simulate, capacity, search, validate

See planner/api.py for the functions and README.md for an example.
"""
from engine.deployment import Deployment
from planner.api import capacity, run_spec, search, simulate, sweep
from planner.runs.spec import Load, RunSpec

__all__ = ["Deployment", "Load", "RunSpec", "capacity", "run_spec", "search", "simulate", "sweep"]
