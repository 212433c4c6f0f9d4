"""What `planner profile` measures and how: the options of a profiling run (no torch here)."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.deployment import Deployment


@dataclass
class ProfileOptions:
    """What to profile (the deployment's model, GPU, TP and block size) and how (grid, repetitions)."""

    deployment: Deployment
    quick: bool = False
    force: bool = False
    per_layer: bool | None = None          # None: only when the full model does not fit
    repeats: int | None = None
    grid_overrides: dict = field(default_factory=dict)
