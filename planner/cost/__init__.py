"""Cost models: how long an engine step of a given shape takes."""

from planner.cost.roofline import RooflineCostModel, RooflineEfficiency
from planner.cost.shape import CostModel, StepShape, prefill_attn_pairs

__all__ = ["CostModel", "RooflineCostModel", "RooflineEfficiency", "StepShape", "prefill_attn_pairs"]
