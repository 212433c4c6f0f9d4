"""A finished simulation leaves nothing behind in a process that goes on: its engines, block pools and cost
models are freed as soon as the result is let go, in every topology. (The collector is paused for runs, so
anything a run left in a reference cycle stayed until a full collection that seldom comes: a process
simulating one deployment after another, a capacity search or a library user's loop, grew by hundreds of
MiB a run where the KV cache was large.)"""
from __future__ import annotations

import gc

import pytest

from engine.deployment import Deployment
from planner.api import simulate
from planner.runs.pd import Disaggregation
from planner.runs.spec import Fleet

SMALL = dict(num_gpu_blocks=512, max_model_len=2048)     # (the pool's size does not matter to what is left)
# Objects that hold a run's memory: none may outlive it in a cycle.
HEAVY = ("SimulatedEngine", "BlockManager", "PrivateBlockManager", "VllmBlockPool", "BlockPool", "ChunkedScheduler",
         "Scheduler", "DecodeScheduler", "SyntheticExecutor", "MeasuredCostModel", "Fleet", "PrefillPool",
         "DecodePool", "Disaggregated", "Lockstep", "ClosedLoop", "StepRecord", "SequenceGroup")


def left_in_cycles(run) -> list[str]:
    """The heavy objects `run()`'s result leaves in reference cycles once it is let go."""
    gc.collect()
    run()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return sorted({type(o).__name__ for o in gc.garbage} & set(HEAVY))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


@pytest.mark.parametrize("deployment, load", [
    (Deployment(model="llama-3.2-1b", gpu="h100", **SMALL), {"rate": 20.0}),
    (Deployment(model="llama-3.2-1b", gpu="h100", **SMALL), {"concurrency": 8}),
    (Deployment(model="llama-3.2-1b", gpu="h100", enable_prefix_caching=True, **SMALL),
     {"concurrency": 8, "fleet": Fleet(2, "prefix-aware")}),
    (Deployment(model="qwen3-30b-a3b", gpu="h100", dp=2, enable_expert_parallel=True, **SMALL), {"rate": 20.0}),
    (Deployment(model="llama-3.2-1b", gpu="h100", **SMALL), {"concurrency": 8, "pd": Disaggregation(1, 1)}),
], ids=["open-loop", "closed-loop", "fleet-of-clients", "dp-lockstep", "prefill-decode"])
def test_a_finished_run_leaves_no_engine_in_a_reference_cycle(deployment, load):
    def run() -> None:
        result = simulate(deployment, workload="random", params={"input_len": 256, "output_len": 16},
                          requests=24, **load)
        assert result.metrics.num_completed == 24
    assert left_in_cycles(run) == []
