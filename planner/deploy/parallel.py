"""Data and expert parallelism of a deployment (vLLM's --data-parallel-size and --enable-expert-parallel).

vLLM lays a MoE's expert layers over all tp x dp GPUs of a deployment (FusedMoEParallelConfig):
without expert parallelism every GPU holds every expert with 1/(tp x dp) of its width (the MoE's
tensor parallel size is tp x dp); with it each GPU holds whole experts, E / (tp x dp) of them
(EP = tp x dp, the experts' width unsplit). Attention stays per replica: dp copies of a tp-way
sharded attention, each with its own scheduler and KV cache. A dense model's dp replicas share
nothing (vLLM runs them as independent engines behind its DP coordinator).

Refused here, in one line each, as vLLM would refuse or could not load them:
- expert parallelism on a model without experts ("--enable-expert-parallel" has nothing to split);
- more EP ranks than experts (a GPU would hold no expert; vLLM's expert map gives each rank
  E // EP experts, zero here);
- without expert parallelism, an expert width that tp x dp does not divide (the weight loader
  narrows each expert's gate/up rows and down columns into tp x dp equal shards).
Uneven expert counts under EP (128 experts over 6 GPUs) are what vLLM runs (the first E % EP ranks get
one more); the plan holds the most loaded GPU's experts and warns.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.deployment import Deployment
from planner.catalog import ModelSpec
from planner.errors import PlannerError


@dataclass(frozen=True, slots=True)
class MoeLayout:
    """How one MoE layer's experts lie over the deployment's GPUs."""

    gpus: int                # tp x dp: every GPU of the deployment runs every MoE layer
    ep: int                  # expert-parallel size (1: experts split by width)
    moe_tp: int              # the experts' width split (1 under expert parallelism)
    experts_per_gpu: int     # experts on the most loaded GPU
    width_per_gpu: int       # each local expert's intermediate width on one GPU

    def describe(self) -> str:
        if self.gpus == 1:
            return "1 GPU holds every expert"
        how = (f"EP{self.ep}: {self.experts_per_gpu} whole experts per GPU" if self.ep > 1
               else f"each expert's width split {self.moe_tp} ways ({self.width_per_gpu} per GPU)")
        return f"{self.gpus} GPUs, {how}"


def moe_layout(model: ModelSpec, deployment: Deployment) -> MoeLayout | None:
    """The experts' layout of `deployment` (None for a dense model), after checking it as vLLM would."""
    check_parallel(model, deployment)
    if not model.is_moe:
        return None
    gpus = deployment.tp * deployment.dp
    if deployment.enable_expert_parallel:
        return MoeLayout(gpus, gpus, 1, -(-model.num_experts // gpus), model.moe_intermediate_size)
    return MoeLayout(gpus, 1, gpus, model.num_experts, model.moe_intermediate_size // gpus)


def check_parallel(model: ModelSpec, deployment: Deployment) -> None:
    """Raise a one-line PlannerError for a dp / expert-parallel setting vLLM would refuse or cannot load."""
    gpus = deployment.tp * deployment.dp
    if deployment.enable_expert_parallel and not model.is_moe:
        raise PlannerError(f"--enable-expert-parallel: {model.name} has no experts to split (a dense model; "
                           f"use --tp/--dp)")
    if not model.is_moe:
        return
    if deployment.enable_expert_parallel and gpus > model.num_experts:
        raise PlannerError(f"expert parallel size {gpus} (tp {deployment.tp} x dp {deployment.dp}) exceeds "
                           f"{model.name}'s {model.num_experts} experts: some GPUs would hold none")
    if not deployment.enable_expert_parallel and model.moe_intermediate_size % gpus:
        raise PlannerError(f"tp {deployment.tp} x dp {deployment.dp} = {gpus} GPUs do not split "
                           f"{model.name}'s expert width {model.moe_intermediate_size} evenly; "
                           f"add --enable-expert-parallel or change --tp/--dp")


def parallel_warnings(model: ModelSpec, deployment: Deployment) -> list[str]:
    """What vLLM runs unevenly: experts that do not divide over the EP ranks."""
    gpus = deployment.tp * deployment.dp
    if model.is_moe and deployment.enable_expert_parallel and model.num_experts % gpus:
        return [f"{model.num_experts} experts over EP{gpus}: vLLM gives {model.num_experts % gpus} GPUs one "
                f"expert more ({-(-model.num_experts // gpus)}); the plan sizes memory and prices time by "
                f"the most loaded GPU"]
    return []
