"""Is a well-formed profile also believable? Its fitted curves, its timings and its labels, checked on load.

A profile can parse and still be wrong: a hand edit, a merge, a copy of another
machine's file. `load_profile` (planner/profile/schema.py) runs these checks
after the schema's, and each problem is one PlannerError line naming the file
and the component or field:

  finite and positive  every knot, value and extra term of every fitted curve,
             every residual spread, every measured time is a finite number;
             values, extras, spreads and times are not negative, and the curve
             that prices steps does not predict zero time at its largest shape.
  monotone   where time must grow with tokens, batch, context or blocks, the
             chosen curve grows: its end segments (which extrapolate past the
             grid) do not slope down and its extra terms (attention pairs,
             sequences, context) are not negative, as planner/profile/fit.py
             fits them. Between grid values a curve follows its measurements,
             dips included: measured CPU times have them (a matmul of 3 rows
             can take longer than one of 4; 18% in the shipped profile), and on
             a busy machine one slow point makes the next look like a tenfold
             dip, so a genuine profile may not be monotone inside the grid.
             Nor is a fit held to its own measurements: after one round on a
             loaded CPU (the first save of a profile timed along a run), a
             point stalled 30-160x made an honest linear fit price its
             sampling points at a fifth of their times.
  labels     the model the profile names, when it is a catalog model, has the
             architecture the profile holds (a profile relabelled "opt-13b"
             whose layers are opt-125m's is refused here, not priced as either);
             the GPU it names is in the catalog and, unless the profile was
             forced, is the kind of device that ran it; the fingerprint agrees
             with the profile on device kind and name, dtype, block size and TP.

Written against the profile's attributes (no import of the schema), so the
schema module can call it.
"""
from __future__ import annotations

import math

from planner.catalog.gpus import gpu_catalog
from planner.catalog.models import model_catalog
from planner.errors import PlannerError
from planner.profile.components import DIFFERENCE_COMPONENTS


def check_profile_values(profile, path) -> None:
    """Refuse (one PlannerError line) a profile whose fits or timings are not finite, positive and monotone."""
    for name, fit in profile.fit.items():
        for method, curve in fit.candidates.items():
            _finite_curve(path, f"fit.{name} ({method})", curve)
        if fit.residual_sd is not None and not (math.isfinite(fit.residual_sd) and fit.residual_sd >= 0):
            raise PlannerError(f"profile {path}: fit.{name}.residual_sd is {fit.residual_sd}: a spread must be a "
                               f"finite number >= 0; {_AGAIN}")
        _monotone_curve(path, f"fit.{name}", fit.curve)
    for i, m in enumerate(profile.measurements):
        times = [m.median_s, *m.samples_s, *(m.layer_medians_s or {}).values()]
        difference = m.component in DIFFERENCE_COMPONENTS     # two passes' difference: noise may take it below 0
        bad = next((t for t in times if not (math.isfinite(t) and (difference or t >= 0))), None)
        if bad is not None:
            raise PlannerError(f"profile {path}: measurement {i} ({m.component}) has a time of {bad} s: times "
                               f"must be finite{'' if difference else ' and >= 0'}; {_AGAIN}")


MAX_PROFILE_NUMBER = 1e9     # seconds, tokens, sequences or blocks: far past any step a machine measures
_AGAIN = "the file is damaged or was edited, run `planner profile` again"


def _finite_curve(path, where: str, curve) -> None:
    numbers = [*curve.knots, *curve.values, *curve.extras.values()]
    bad = next((x for x in numbers if not math.isfinite(x)), None)
    if bad is not None:
        raise PlannerError(f"profile {path}: {where} holds {bad}: every knot, value and term must be a finite "
                           f"number; {_AGAIN}")
    # finite is not enough: a step of 1e308 s, or a curve out to 1e308 tokens, overflows what prices it
    huge = next((x for x in numbers if abs(x) > MAX_PROFILE_NUMBER), None)
    if huge is not None:
        raise PlannerError(f"profile {path}: {where} holds {huge:g}: no measured knot, time or term is over "
                           f"{MAX_PROFILE_NUMBER:g}; {_AGAIN}")
    negative = next(((k, v) for k, v in zip(curve.knots, curve.values) if v < 0), None)
    if negative is not None:
        raise PlannerError(f"profile {path}: {where} is negative ({negative[1]:.4g} s at {curve.main} "
                           f"{negative[0]:g}): a time cannot be; {_AGAIN}")
    term = next(((k, v) for k, v in curve.extras.items() if v < 0), None)
    if term is not None:
        raise PlannerError(f"profile {path}: {where} has a negative {term[0]} term ({term[1]:.4g} s each): time "
                           f"must grow with {term[0]}; {_AGAIN}")


def _monotone_curve(path, where: str, curve) -> None:
    """The chosen curve grows where time must: past the grid at both ends, and it prices something."""
    k, v, main = curve.knots, curve.values, curve.main
    if v[-1] <= 0:
        raise PlannerError(f"profile {path}: {where} predicts no time at all ({v[-1]:.4g} s at {main} {k[-1]:g}); "
                           f"{_AGAIN}")
    if len(v) < 2:
        return
    for a, b, side in ((0, 1, "below its first"), (-2, -1, "past its last")):
        if v[b] < v[a]:
            raise PlannerError(f"profile {path}: {where} decreases {side} grid values ({v[a]:.4g} s at {main} "
                               f"{k[a]:g}, {v[b]:.4g} s at {k[b]:g}): time must grow with {main}; {_AGAIN}")


def check_profile_labels(profile, path) -> None:
    """Refuse a profile whose model, GPU or fingerprint contradict what it holds."""
    arch, device = profile.model, profile.device
    known = model_catalog().find(arch.name)
    if known is not None:
        differs = arch.mismatch(known)
        if differs:
            raise PlannerError(f"profile {path} describes model {arch.name!r} but holds another architecture "
                               f"({differs.replace(' != ', ' where ' + known.name + ' has ')}): {_AGAIN} "
                               f"(--model {known.name})")
    gpu = gpu_catalog().find(device.gpu)
    if gpu is None:
        raise PlannerError(f"profile {path} describes GPU {device.gpu!r}, which is not in the catalog "
                           f"(planner list gpus); {_AGAIN}")
    if not device.forced and gpu.kind != device.kind:
        raise PlannerError(f"profile {path} describes {gpu.name} (a {gpu.kind}) but was measured on a "
                           f"{device.kind} ({device.device_name}) without --force; {_AGAIN}")
    fp = profile.fingerprint
    if fp is None:
        return
    said = {"device kind": (fp.device_kind, device.kind), "device": (fp.device_name, device.device_name),
            "dtype": (fp.dtype, profile.dtype), "block size": (fp.block_size, profile.block_size),
            "TP": (fp.tp, profile.tp)}
    differs = [f"{what} {a!r} (profile: {b!r})" for what, (a, b) in said.items() if a != b]
    if differs:
        raise PlannerError(f"profile {path}: its fingerprint contradicts the profile: {', '.join(differs)}; "
                           f"{_AGAIN}")
