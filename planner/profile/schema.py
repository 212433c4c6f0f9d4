"""The profile file: one versioned JSON document per (device, model), written by `planner profile`.

It keeps everything needed to trust and reuse a measurement: what device and
software ran it, the model architecture, the grid of shapes, every raw timing,
and the fitted step-time components with their cross-validated errors. A
damaged file (not JSON, missing or mistyped fields, unknown extra fields) or a
file of another schema version is refused with a one-line PlannerError that
names the file and what is wrong; so is one whose fits are not finite, positive
and monotone, or whose labels contradict it (planner/profile/validity.py).
"""

from __future__ import annotations

import os

import statistics
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from planner.documents import read_json
from planner.catalog import ModelSpec
from planner.errors import PlannerError
from planner.profile.validity import check_profile_labels, check_profile_values

# Bump when a field changes meaning or the step-time model changes; old files are then refused.
PROFILE_SCHEMA_VERSION = 1

# The step-time components a profile fits (see planner/cost/calibrated.py for how they add up).
COMPONENTS = ("prefill", "decode", "sched_prefill", "sched_decode", "sample_greedy", "sample_random",
              "swap", "copy")
# Each component is a monotone piecewise-linear curve of its main variable plus
# non-negative linear terms in its extra features; these are the variable names.
COMPONENT_FEATURES: dict[str, tuple[str, tuple[str, ...]]] = {
    # context: tokens already cached that the prompts continue from (0 for a fresh prompt; measurements
    # written before such prompts were timed lack it and read as 0, which is what they timed).
    "prefill": ("tokens", ("attn_pairs", "seqs", "context")),
    "decode": ("seqs", ("context",)),
    "sched_prefill": ("seqs", ()),
    "sched_decode": ("seqs", ()),
    "sample_greedy": ("seqs", ()),
    "sample_random": ("seqs", ()),
    "swap": ("blocks", ()),
    "copy": ("blocks", ()),
    "lora": ("tokens", ("adapters",)),   # what LoRA adapters add to a forward pass (--enable-lora profiles only)
    # What decode rows add to a forward pass over a prompt chunk (a chunked-prefill step); profiles written
    # before it was timed lack it, and the calibrated model then derives it from the prefill and decode curves.
    "mixed_decode": ("seqs", ()),
}


class _Strict(BaseModel):
    # extra="forbid": a typo or a stray field is a damaged file, not something to ignore.
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class DeviceInfo(_Strict):
    gpu: str                         # catalog name the profile is for ("cpu", "a100-80g")
    kind: Literal["cpu", "gpu"]      # what actually ran it
    device_name: str                 # as the driver / OS reports it
    memory_bytes: int
    torch_version: str
    cuda_version: str | None = None
    driver_version: str | None = None
    kernel_backend: str              # cuda_ext backend the engine used: cuda, cpu or torch
    threads: int                     # torch intra-op threads (CPU runs)
    load_average: float | None = None  # 1-minute load when the run started: a busy host inflates timings
    # OpenMP settings change CPU timings several-fold on a busy host (threads spinning at
    # barriers); the engine must run with the same ones for the profile to apply.
    omp_env: dict[str, str] = Field(default_factory=dict)
    forced: bool = False             # --force: the device does not match `gpu`


class Fingerprint(_Strict):
    """What the timings depend on, so a profile can be matched to a run and checked against this machine.

    Written by `planner profile` (planner/profile/check.py builds it); profiles
    written before fingerprints have none and are reported as "unchecked".
    """
    device_kind: Literal["cpu", "gpu"]
    device_name: str                 # the GPU's name, or the CPU model on a CPU run
    cpu_model: str
    cpu_cores: int                   # physical cores
    cpu_threads: int                 # logical CPUs
    torch_threads: int               # torch intra-op threads the timings ran with
    torch_version: str
    kernel_backend: str
    dtype: str
    block_size: int
    tp: int
    engine_version: str              # package version + hash of the engine's sources


class ModelArch(_Strict):
    name: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    # A MoE's experts (0: dense; profiles written before MoE models read as dense, which they were)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0

    @classmethod
    def of(cls, spec: ModelSpec) -> "ModelArch":
        return cls(**{name: getattr(spec, name) for name in cls.model_fields})

    def mismatch(self, spec: ModelSpec) -> str | None:
        """The first architecture field that differs from `spec`, as 'field X != Y', or None."""
        for name in type(self).model_fields:
            if name != "name" and getattr(self, name) != getattr(spec, name):
                return f"{name} {getattr(self, name)} != {getattr(spec, name)}"
        return None


class Grid(_Strict):
    quick: bool
    prefill_tokens: list[int]
    prefill_seqs: list[int]
    # Cached contexts one prompt of each prefill_tokens length (16 and up) is also timed after; a profile
    # written before they were measured has none.
    prefill_context: list[int] = Field(default_factory=list)
    decode_batch: list[int]
    decode_context: list[int]
    host_batch: list[int]
    block_counts: list[int]
    warmup: int
    repeats: int
    kv_cache_blocks: int             # device blocks allocated: decode points beyond it were skipped
    notes: list[str] = Field(default_factory=list)   # how the grid was scaled down, points skipped


class Measurement(_Strict):
    component: str
    features: dict[str, float]       # the component's variables at this point
    median_s: float                  # full-model seconds (after per-layer scaling when used)
    spread: float                    # (p90 - p10) / median of the repetitions
    samples_s: list[float]           # raw repetitions of the (first) measured model
    layer_medians_s: dict[str, float] | None = None   # per-layer scaling: {"1": t1, "2": t2}

    @property
    def mean_s(self) -> float:
        """Full-model mean seconds: median_s times the repetitions' mean / median.

        The cost model is fitted to this, not to the median: E2E and throughput add step times
        up, and a sum follows the mean. On a CPU a step's time is skewed to the right (a slow
        spell stretches a few repetitions), so the median priced steps 1-2% fast.
        """
        if not self.samples_s:
            return self.median_s
        middle = statistics.median(self.samples_s)
        return self.median_s * statistics.fmean(self.samples_s) / middle if middle > 0 else self.median_s


class CurveFit(_Strict):
    """v(main) piecewise-linear through (knots, values), extended by the end segments, plus sum(extras)."""

    method: Literal["linear", "piecewise"]
    main: str
    knots: list[float]
    values: list[float]
    extras: dict[str, float]


class CvError(_Strict):
    # None when there were too few points to hold any out (folds == 0).
    mean_rel: float | None           # mean |pred - measured| / measured over held-out points
    median_rel: float | None
    max_rel: float | None
    folds: int


class ComponentFit(_Strict):
    chosen: Literal["linear", "piecewise"]
    candidates: dict[str, CurveFit]
    cv: dict[str, CvError]
    # Relative spread (RMS of sample / prediction - 1 over every raw repetition) of the chosen
    # curve: fit error and run-to-run noise together; `--timing-noise` samples it. None: older file.
    residual_sd: float | None = None

    @property
    def curve(self) -> CurveFit:
        return self.candidates[self.chosen]


class ExpertsTouched(_Strict):
    """A MoE's distinct experts per layer in one forward pass of `tokens` tokens (planner/profile/routing.py)."""
    tokens: int
    measured: float                  # the engine's mean over its MoE layers
    uniform: float                   # E (1 - (1 - k/E) ** tokens), what the cost models assume


class Profile(_Strict):
    schema_version: int
    created: str                     # ISO 8601, UTC
    device: DeviceInfo
    model: ModelArch
    tp: int
    block_size: int
    dtype: str
    per_layer_scaling: bool          # True: 1- and 2-layer models measured, total = fixed + layers * per-layer
    grid: Grid
    measurements: list[Measurement]
    fit: dict[str, ComponentFit]
    fingerprint: Fingerprint | None = None   # None: written before fingerprints ("unchecked")
    experts_touched: list[ExpertsTouched] = Field(default_factory=list)   # a MoE's routing, measured
    lora_rank: int | None = Field(None, ge=1)   # --enable-lora: the adapters' rank the "lora" component timed


def save_profile(profile: Profile, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(profile.model_dump_json(indent=1) + "\n", encoding="utf-8")
    return path


def _describe(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "top level"
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


def load_profile(path: str | Path) -> Profile:
    """Read and check a profile file; every problem is a one-line PlannerError naming the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PlannerError(f"profile {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PlannerError(f"profile {path}: cannot be read ({exc})") from None
    try:
        data = read_json(text)
    except ValueError as exc:
        raise PlannerError(f"profile {path}: {exc}; the file is damaged, run `planner profile` again") from None
    if not isinstance(data, dict):
        raise PlannerError(f"profile {path}: expected a JSON object, got {type(data).__name__}")
    version = data.get("schema_version")
    if version != PROFILE_SCHEMA_VERSION or type(version) is not int:      # (true == 1)
        raise PlannerError(f"profile {path}: schema version {version!r}, this planner reads version "
                           f"{PROFILE_SCHEMA_VERSION}; run `planner profile` again")
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        raise PlannerError(f"profile {path}: damaged ({_describe(exc)})") from None
    missing = [c for c in COMPONENTS if c not in profile.fit]
    if missing:
        raise PlannerError(f"profile {path}: damaged (no fit for {', '.join(missing)})")
    if ("lora" in profile.fit) != (profile.lora_rank is not None):
        raise PlannerError(f"profile {path}: damaged (a LoRA fit and lora_rank come together)")
    for name, fit in profile.fit.items():
        if name not in COMPONENT_FEATURES:      # each fit a component's, over its own variables
            raise PlannerError(f"profile {path}: damaged (fit.{name} is no component this planner prices)")
        main, extras = COMPONENT_FEATURES[name]
        for method, candidate in fit.candidates.items():
            unknown = sorted(set(candidate.extras) - set(extras))
            if candidate.main != main or unknown:
                raise PlannerError(f"profile {path}: damaged (fit.{name} ({method}) is over "
                                   f"{', '.join([candidate.main, *unknown])}; {name}'s variables are "
                                   f"{', '.join([main, *extras])})")
        curve = fit.candidates.get(fit.chosen)
        if curve is None:
            raise PlannerError(f"profile {path}: damaged (fit.{name} chose {fit.chosen!r} but has no such candidate)")
        if not curve.knots or len(curve.knots) != len(curve.values) or curve.knots != sorted(set(curve.knots)):
            raise PlannerError(f"profile {path}: damaged (fit.{name}: knots must be increasing and "
                               "match the values)")
    check_profile_values(profile, path)
    check_profile_labels(profile, path)
    return profile


# The checkout's profiles/ folder, where `planner profile` files what it measures and where the shipped
# profiles are, wherever the command runs from.
SHIPPED_PROFILES = Path(__file__).resolve().parents[2] / "profiles"


def profiles_dir() -> Path:
    """Where profiles are filed: $PLANNER_PROFILE_DIR if set, else the checkout's profiles/ folder."""
    return Path(os.environ.get("PLANNER_PROFILE_DIR") or SHIPPED_PROFILES)


def profile_path(gpu_name: str, model_name: str) -> Path:
    """Where the profile of `model_name` on `gpu_name` is filed."""
    return profiles_dir() / gpu_name / f"{model_name}.json"
