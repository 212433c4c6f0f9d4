"""The SimPy simulator of the paged engine: `simulate(trace, SimConfig(...), cost_model) -> SimResult`."""

from planner.sim.config import SIM_BLOCK_SIZES, SimConfig
from planner.sim.engine import SimResult, simulate

__all__ = ["SIM_BLOCK_SIZES", "SimConfig", "SimResult", "simulate"]
