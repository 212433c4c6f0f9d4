"""Can this profile be trusted for this run? Fingerprint, matching and the canary.

A profile's timings hold only for the machine, software and engine settings
that produced them. Three checks keep a stale or foreign profile from being
used silently:

  fingerprint  `planner profile` records the device, CPU, thread counts, torch
               version, kernel backend, dtype, block size, TP and engine
               version (`make_fingerprint`).
  matching     a run uses a profile only if GPU, model, block size, dtype and TP
               all agree; a profile that differs in some of them is a near miss,
               reported in one line saying what differs (`find_profile`).
  canary       when the profiled device is this machine, a few of the profile's
               own forward-pass grid points are timed again with the profiler's
               timing code (at most ~10 s); the median over points of measured /
               profiled off by more than 7% means the profile is stale
               (`check_profile`). `validate` times the same points right before
               and after its live run (planner/profile/speed.py).

Without the device here (a GPU profile on a laptop) only the fingerprint can
be looked at, and the check says so: status "unchecked".
"""
from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

from planner.catalog import GpuSpec, ModelSpec, gpu_variant_for_memory
from planner.errors import PlannerError
from planner.profile.checkpoints import model_folder
from planner.profile.schema import Fingerprint, Profile, load_profile

TOLERANCE = 0.07          # canary measured / profiled beyond 1 +- this: stale
CANARY_BUDGET_S = 10.0    # the whole canary, model load included, stays under this
_ROOT = Path(__file__).resolve().parents[2]   # the checkout: engine/ and cuda_ext/ sit there


# -- fingerprint ---------------------------------------------------------------

@lru_cache(maxsize=1)
def engine_version() -> str:
    """The package version plus a hash of the engine's and kernels' sources: any code change shows."""
    try:
        from importlib.metadata import version
        base = version("paged-planner")
    except Exception:  # noqa: BLE001 - not installed (tests from a checkout): the hash still identifies it
        base = "0"
    digest = hashlib.sha256()
    for folder in ("engine", "cuda_ext"):
        for path in sorted((_ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".cpp", ".cu", ".h", ".cuh") and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(_ROOT)).encode())
                digest.update(path.read_bytes())
    return f"{base}+{digest.hexdigest()[:12]}"


@lru_cache(maxsize=1)
def cpu_topology() -> tuple[str, int, int]:
    """(CPU model, physical cores, logical CPUs) of this host."""
    model, cores = "", set()
    physical = core = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "model name" and not model:
                    model = value
                elif key == "physical id":
                    physical = value
                elif key == "core id":
                    core = value
                elif not key and core is not None:
                    cores.add((physical, core))
                    core = None
        if core is not None:
            cores.add((physical, core))
    except OSError:
        pass
    import platform
    threads = os.cpu_count() or 1
    return model or platform.processor() or platform.machine(), len(cores) or threads, threads


def make_fingerprint(info, *, dtype: str, block_size: int, tp: int) -> Fingerprint:
    """The fingerprint of a profile being written; `info` is its DeviceInfo."""
    cpu_model, cores, threads = cpu_topology()
    return Fingerprint(device_kind=info.kind, device_name=info.device_name, cpu_model=cpu_model,
                       cpu_cores=cores, cpu_threads=threads, torch_threads=info.threads,
                       torch_version=info.torch_version, kernel_backend=info.kernel_backend, dtype=dtype,
                       block_size=block_size, tp=tp, engine_version=engine_version())


# -- matching ------------------------------------------------------------------

def engine_dtype(gpu: GpuSpec, dtype_bytes: int = 2) -> str:
    """The dtype the engine runs in on `gpu`: fp32 on a CPU (as the profiler does), else by width."""
    if gpu.kind == "cpu":
        return "float32"
    return {2: "float16", 4: "float32"}.get(dtype_bytes, f"{8 * dtype_bytes}-bit")


def config_differences(profile: Profile, *, block_size: int, dtype: str, tp: int) -> list[str]:
    """What about the engine settings differs between the profile and the run, as 'block size 16 (run: 32)'."""
    wanted = {"block size": (profile.block_size, block_size), "dtype": (profile.dtype, dtype),
              "TP": (profile.tp, tp)}
    return [f"{name} {have} (run: {want})" for name, (have, want) in wanted.items() if have != want]


def check_settings(profile: Profile, source: str | Path, *, block_size: int, dtype: str, tp: int) -> None:
    """An explicitly chosen profile must have the run's settings: else a one-line error."""
    differs = config_differences(profile, block_size=block_size, dtype=dtype, tp=tp)
    if differs:
        raise PlannerError(f"profile {source} does not match this run: {', '.join(differs)}; "
                           f"profile with these settings (planner profile ... --block-size {block_size})")


def find_profile(folder: Path, model: ModelSpec, *, block_size: int, dtype: str,
                 tp: int) -> tuple[Path | None, str | None]:
    """(profile to use, None) or (None, near-miss message) among the profiles in `folder` for `model`.

    A file qualifies when its model architecture is `model`'s; it is used only if
    block size, dtype and TP agree as well. Unreadable files are skipped here
    (an explicit --profile names them instead).
    """
    if not folder.is_dir():
        return None, None
    near: list[tuple[Path, list[str]]] = []
    for path in sorted(folder.glob("*.json")):
        try:
            profile = load_profile(path)
        except PlannerError:
            continue
        if profile.model.mismatch(model) is not None:
            continue
        differs = config_differences(profile, block_size=block_size, dtype=dtype, tp=tp)
        if not differs:
            return path, None
        near.append((path, differs))
    if not near:
        return None, None
    path, differs = near[0]
    return None, (f"profile {path} not used: {', '.join(differs)}; profile with the run's settings "
                  f"to use measured timings (planner profile --block-size {block_size})")


# -- the check -----------------------------------------------------------------

@dataclass
class ProfileCheck:
    status: str                          # ok | stale | unchecked
    reason: str
    ratio: float | None = None           # canary: measured / profiled time
    fingerprint_only: bool = False       # the device is not here: only the fingerprint was looked at
    canary: list[dict] = field(default_factory=list)   # the points timed

    def as_dict(self) -> dict:
        return asdict(self)

    def headline(self) -> str:
        ratio = f", canary ratio {self.ratio:.3f}" if self.ratio is not None else ""
        return f"profile check: {self.status}{ratio} ({self.reason})"


def _device_here(fp: Fingerprint, gpu_name: str) -> tuple[bool, list[str]]:
    """(is the profiled kind of device here, hardware differences from the fingerprint)."""
    cpu_model, cores, threads = cpu_topology()
    if fp.device_kind == "cpu":
        import torch
        here = {"CPU": (fp.cpu_model, cpu_model), "cores": (fp.cpu_cores, cores),
                "threads": (fp.cpu_threads, threads), "torch threads": (fp.torch_threads, torch.get_num_threads())}
        return True, [f"{k} {a!r} (here: {b!r})" for k, (a, b) in here.items() if a != b]
    import torch
    if not torch.cuda.is_available():
        return False, []
    name = torch.cuda.get_device_name(0)
    try:
        variant = gpu_variant_for_memory(name, torch.cuda.get_device_properties(0).total_memory)
    except PlannerError:
        variant = None
    if variant is None or variant.name != gpu_name:
        return False, []
    return True, [f"GPU {fp.device_name!r} (here: {name!r})"] if name != fp.device_name else []


def _software_differences(fp: Fingerprint) -> list[str]:
    import torch
    from cuda_ext import ops      # torch: only a profile check on the profiled device needs it
    here = {"torch": (fp.torch_version, torch.__version__), "kernels": (fp.kernel_backend, ops.backend),
            "engine": (fp.engine_version, engine_version())}
    return [f"{k} {a} (here: {b})" for k, (a, b) in here.items() if a != b]


def check_profile(profile: Profile, source: str | Path, *, model_folder=None, canary: bool = True,
                  budget_s: float = CANARY_BUDGET_S, tolerance: float = TOLERANCE) -> ProfileCheck:
    """Is `profile` (read from `source`) trustworthy on this machine? Runs the canary when it can.

    `model_folder`: a checkpoint of the profiled architecture for the canary's
    forward passes, or a function returning one (called only when the canary
    runs; it may raise PlannerError); None: no canary, the fingerprint alone decides.
    """
    fp = profile.fingerprint
    if fp is None:
        return ProfileCheck("unchecked", f"{source} has no fingerprint (written before fingerprints); "
                                         "run `planner profile` again to check it")
    present, hardware = _device_here(fp, profile.device.gpu)
    if not present:
        return ProfileCheck("unchecked", f"{profile.device.gpu} ({fp.device_name}) is not on this machine: "
                                         f"checked by fingerprint only (dtype {fp.dtype}, block size "
                                         f"{fp.block_size}, TP {fp.tp}, engine {fp.engine_version})",
                            fingerprint_only=True)
    if hardware:
        return ProfileCheck("stale", f"profiled on another machine: {'; '.join(hardware)}")
    software = _software_differences(fp)
    note = f"; software changed since profiling: {'; '.join(software)}" if software else ""
    if not canary or model_folder is None:
        return ProfileCheck("unchecked", f"fingerprint matches this machine; canary not run{note}")
    if profile.per_layer_scaling:
        return ProfileCheck("unchecked", f"fingerprint matches this machine; a per-layer-scaled profile has "
                                         f"no full-model points to time again{note}")
    if callable(model_folder):
        try:
            model_folder = model_folder()
        except PlannerError as exc:
            return ProfileCheck("unchecked", f"fingerprint matches this machine; canary not run ({exc}){note}")
    points, ratio = run_canary(profile, model_folder, budget_s=budget_s)
    if ratio is None:
        return ProfileCheck("unchecked", f"fingerprint matches this machine; no canary point fit in "
                                         f"{budget_s:.0f} s{note}")
    within = abs(ratio - 1) <= tolerance
    verdict = (f"canary within {tolerance:.0%}" if within else
               f"canary {ratio - 1:+.1%} off the profile (limit {tolerance:.0%}): the machine has changed")
    return ProfileCheck("ok" if within else "stale", verdict + note, ratio, canary=points)


def check_cost_model(cost_model, model: str, *, canary: bool = True) -> ProfileCheck:
    """The check of whatever profile `cost_model` rests on (`model`: the run's model name or folder)."""
    profile = getattr(cost_model, "profile", None)
    if profile is None:
        note = getattr(cost_model, "profile_note", None)
        return ProfileCheck("unchecked", note or f"no profile: {cost_model.name} cost model")

    def folder() -> str:
        return model_folder(model)[0]
    return check_profile(profile, getattr(cost_model, "source", "profile"), model_folder=folder, canary=canary)


# -- canary --------------------------------------------------------------------

CANARY_REPEATS = 3


def canary_points(profile: Profile, budget_s: float) -> list:
    """Up to three prefill and three decode points of the profile's grid (small, middle, large) that
    together fit in half the budget at CANARY_REPEATS + 1 calls each."""
    chosen = []
    for component in ("prefill", "decode"):
        points = sorted((m for m in profile.measurements if m.component == component), key=lambda m: m.median_s)
        if points:
            picks = {0, len(points) // 2, (9 * (len(points) - 1)) // 10}
            chosen += [points[i] for i in sorted(picks)]
    chosen.sort(key=lambda m: m.median_s)
    kept, spent = [], 0.0
    for m in chosen:
        cost = m.median_s * (CANARY_REPEATS + 1)
        if spent + cost > budget_s / 2:
            break
        kept.append(m)
        spent += cost
    return kept


def run_canary(profile: Profile, model_folder: str, *, budget_s: float = CANARY_BUDGET_S,
               measure=None) -> tuple[list[dict], float | None]:
    """Time canary points again on a runner built for them; returns (points, measured / profiled).

    `measure(runner, measurement) -> seconds` defaults to the profiler's own
    timing (planner.profile.pieces); tests pass a fake.
    """
    started = time.perf_counter()
    selected = canary_points(profile, budget_s)
    if not selected:
        return [], None
    import torch

    from engine.model_runner import ModelRunner      # torch: only the canary runs the model

    device = torch.device("cpu") if profile.device.kind == "cpu" else torch.device("cuda", 0)
    bs = profile.block_size
    blocks = max([int(m.features["seqs"]) * -(-int(m.features["context"] // m.features["seqs"]) // bs)
                  for m in selected if m.component == "decode"] +
                 [-(-(int(m.features["tokens"]) + int(m.features.get("context", 0))) // bs) * int(m.features["seqs"])
                  for m in selected if m.component == "prefill"] + [1])
    runner = ModelRunner(model_folder, block_size=bs, num_gpu_blocks=blocks + 1, num_cpu_blocks=0,
                         dtype=getattr(torch, profile.dtype), device=device)
    remaining = budget_s - (time.perf_counter() - started)
    points = time_canary(selected, runner, budget_s=remaining, measure=measure)
    return points, canary_ratio(points)


def time_canary(selected: list, runner, *, budget_s: float, measure=None) -> list[dict]:
    """Time the profile measurements `selected` again on `runner` (the canary's own, or a live engine's);
    one dict per point, its measured time the median of its repetitions.

    As the profiler does: one untimed call per point, then rounds of one call per
    point in a fresh random order (back-to-back repetitions of one shape run
    warmer, and faster, than the profile's). Rounds stop once `budget_s` is spent,
    after the first. `measure(runner, measurement) -> seconds` times one call;
    tests pass a fake.
    """
    started = time.perf_counter()
    import random
    import statistics

    import torch

    from planner.profile import pieces               # torch

    rng = random.Random(0)

    def sync():
        if runner.device.type == "cuda":
            torch.cuda.synchronize(runner.device)

    inputs = {}

    def one_call(_runner, m) -> float:
        key = id(m)
        if key not in inputs:
            f = m.features
            inputs[key] = (pieces.prefill_inputs(runner, int(f["tokens"]), int(f["seqs"]), rng,
                                                 int(f.get("context", 0)))
                           if m.component == "prefill" else
                           pieces.decode_inputs(runner, int(f["seqs"]), int(f["context"]) // int(f["seqs"]), rng))
        return pieces.time_forward(runner, inputs[key], sync, 0, 1)[0]

    measure = measure or one_call
    for m in selected:
        measure(runner, m)                          # warm-up, untimed
    samples: dict[int, list[float]] = {i: [] for i in range(len(selected))}
    order = list(samples)
    for round_ in range(CANARY_REPEATS):
        if round_ and time.perf_counter() - started > budget_s:
            break
        rng.shuffle(order)
        for i in order:
            samples[i].append(measure(runner, selected[i]))
    return [{"component": m.component, "features": m.features, "profile_s": m.median_s,
             "measured_s": statistics.median(samples[i])} for i, m in enumerate(selected)]


def canary_ratio(points: list[dict]) -> float | None:
    """The median over points of measured / profiled time.

    The median rather than a ratio of sums: one point the profile caught in a
    slow spell (a shared CPU can stall a step tenfold while another process
    runs) must not decide the verdict on its own.
    """
    ratios = sorted(p["measured_s"] / p["profile_s"] for p in points
                    if p["profile_s"] > 0 and math.isfinite(p["measured_s"]))
    if not ratios:
        return None
    mid = len(ratios) // 2
    return ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2


# -- validate: the live engine runs where the profile was measured --------------

def cuda_catalog_entry() -> tuple[str, GpuSpec | None] | None:
    """(driver name, catalog entry or None) of the CUDA device here, or None without one."""
    import torch
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    try:
        return name, gpu_variant_for_memory(name, torch.cuda.get_device_properties(0).total_memory)
    except PlannerError:
        return name, None


def require_device(gpu: GpuSpec) -> None:
    """The live engine must run on `gpu` itself: on a CUDA host, the catalog entry the device is."""
    if gpu.kind == "cpu":
        return
    found = cuda_catalog_entry()
    if found is None:
        raise PlannerError(f"no CUDA device found: cannot validate on {gpu.name} here (use --gpu cpu)")
    name, entry = found
    if entry is None or entry.name != gpu.name:
        hint = f"; validate with --gpu {entry.name}" if entry else ""
        raise PlannerError(f"the CUDA device here is {name!r} ({entry.name if entry else 'not in the catalog'}), "
                           f"not {gpu.name}: a validation runs on the GPU it names{hint}")


def pin_live_device(gpu: GpuSpec, profile: Profile) -> tuple[str, str]:
    """(device, dtype) for the live engine: the profile's, on the device it names (one-line error if not)."""
    if profile.device.forced:
        raise PlannerError(f"the profile for {gpu.name} was forced (measured on {profile.device.device_name}); "
                           "validating needs a profile of the device itself")
    if profile.device.kind == "cpu":
        if gpu.kind != "cpu":
            raise PlannerError(f"the profile for {gpu.name} was measured on a CPU")
        return "cpu", profile.dtype
    require_device(gpu)
    return "cuda", profile.dtype
