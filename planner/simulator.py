"""Public entry point of the simulator (the code lives in planner/sim/):

    from planner.simulator import SimConfig, simulate
    result = simulate(trace, SimConfig(model, gpu), select_cost_model(model, gpu))
"""

from planner.sim import SIM_BLOCK_SIZES, SimConfig, SimResult, simulate

__all__ = ["SIM_BLOCK_SIZES", "SimConfig", "SimResult", "simulate"]
