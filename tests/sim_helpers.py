"""Deployment plans for simulator tests: a model and GPU by name or spec, any deployment setting."""
from __future__ import annotations

from engine.deployment import Deployment
from planner.deploy.plan import DeploymentPlan, plan_deployment


def sim_plan(model="opt-125m", gpu="a100-40g", **knobs) -> DeploymentPlan:
    """What `simulate` takes. No refusals: the tests' tiny caches are what vLLM would refuse. The simulator
    tests were written for the paper's scheduler: it is theirs unless a test names a policy (by `policy`, or
    `enable_chunked_prefill=True`, vLLM v1's alone), although vllm-v1 is the deployment's default; and for
    synchronous scheduling (vLLM's default is async on a GPU) unless a test names `async_scheduling`."""
    if "policy" not in knobs and not knobs.get("enable_chunked_prefill"):
        knobs["policy"] = "paper"
    knobs.setdefault("async_scheduling", False)
    deployment = Deployment.of(model=getattr(model, "name", model), gpu=getattr(gpu, "name", gpu), **knobs)
    return plan_deployment(deployment, refuse=False)


class ConstantCost:
    """10 ms a step, whatever the step: a live run and its simulation then differ only in their decisions."""

    name = "constant(10ms)"

    def step_time(self, shape) -> float:
        return 0.01


def search_grid(*, model: str, workload: str, duration=None, requests=None, seed: int = 0, **grid):
    """A SearchGrid over a base run of `model` on `workload` (the grid's own fields as keywords)."""
    from planner.runs.spec import Load, RunSpec
    from planner.sizing.search import SearchGrid

    knobs = {"policy": "paper"}   # the search tests' scheduler (as sim_plan's), unless one names a policy
    knobs.update({k: grid.pop(k) for k in ("preemption_mode", "enable_prefix_caching", "policy") if k in grid})
    base = RunSpec(deployment=Deployment(model=model, **knobs),
                   load=Load(workload=workload, duration=duration, requests=requests, seed=seed))
    return SearchGrid(base=base, **grid)
