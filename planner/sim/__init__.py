"""The SimPy simulator of the paged engine: `simulate(trace, plan, cost_model) -> SimResult`."""

from planner.sim.engine import SimResult, simulate

__all__ = ["SimResult", "simulate"]
