"""Fitting a profile's timings: per component, a curve chosen by cross-validated error.

Every component is modelled as

    t = v(main) + sum_i c_i * extra_i,      v piecewise-linear, c_i >= 0

(prefill: v(tokens) + c1 * attn_pairs + c2 * seqs + c3 * context; decode: v(seqs) + c * context;
the host-side and block-move components: v(batch) or v(blocks) alone), fitted
to each point's mean time (Measurement.mean_s: steps add up). Two
candidates differ only in v's knots:

  linear     two knots (the smallest and largest grid value): a straight line,
             i.e. least squares on the physical features;
  piecewise  a knot at every grid value: interpolation over the grid that
             follows e.g. a CPU's matmul efficiency changing with batch size,
             extended past the grid by its end segments.

Both are linear in their parameters (v is written as an intercept plus one
ramp per segment), so one non-negative least-squares solve fits either. The
end segments, which extrapolate, and the extra terms are non-negative, so
beyond the grid more tokens, context or sequences never predict a faster step;
interior segments may slope down, because measured CPU times do (a matmul of 3
rows can take longer than one of 4). Rows are divided by the measured time
so the fit minimises relative error, the error the simulator cares about.
k-fold cross-validation (knots re-derived from each training fold, so a
held-out grid value tests interpolation or extrapolation honestly) picks the
candidate with the lower mean relative error, except for the forward passes,
which are always piecewise (FORWARD_COMPONENTS says why).
"""

from __future__ import annotations

import numpy as np

from planner.profile.components import DIFFERENCE_COMPONENTS
from planner.profile.schema import COMPONENT_FEATURES, ComponentFit, CurveFit, CvError, Measurement

METHODS = ("linear", "piecewise")
MAX_FOLDS = 5
# The forward passes keep a knot at every grid value whatever cross-validation says. Their
# grids are dense where the device's times bend (a CPU matmul of 2 or 3 rows costs more than one of
# 4), and live steps land on grid shapes (prompts of 1-4 tokens, decode batches either side of a
# multiple of 4). Holding a grid value out asks a curve to bridge a gap twice as wide as it ever
# will: on the 2-core VM the prefill choice flipped between quick profiles of the same machine (5
# of 12 took the line), and the line priced 2- and 3-token prompts 15-25% fast.
FORWARD_COMPONENTS = ("prefill", "decode")
# DIFFERENCE_COMPONENTS (a difference of two passes, maybe negative) are fitted to each point's median (robust to
# the spells a mean takes in) by absolute, not relative, error, and always as the straight line of their
# physical terms.


def nnls(a: np.ndarray, b: np.ndarray, tol: float = 1e-12) -> np.ndarray:
    """min ||a x - b|| subject to x >= 0 (Lawson and Hanson's active-set method)."""
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    for _ in range(3 * n + 10):
        w = a.T @ (b - a @ x)
        candidates = ~passive & (w > tol)
        if not candidates.any():
            break
        passive[np.argmax(np.where(candidates, w, -np.inf))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            # Step toward z until the first passive coefficient hits zero, then drop it.
            shrinking = passive & (z <= 0)
            alpha = np.min(x[shrinking] / (x[shrinking] - z[shrinking]))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
    return x


def knots_for(method: str, x: np.ndarray) -> np.ndarray:
    unique = np.unique(x)
    if method == "linear" and len(unique) > 2:
        return unique[[0, -1]]
    return unique


def ramps(x: np.ndarray, knots: np.ndarray) -> np.ndarray:
    """Columns [1, r_1 .. r_K]: r_j rises 0 -> 1 over segment j; the end segments extend past the grid."""
    cols = [np.ones_like(x)]
    last = len(knots) - 1
    for j in range(1, last + 1):
        r = (x - knots[j - 1]) / (knots[j] - knots[j - 1])
        cols.append(np.clip(r, None if j == 1 else 0.0, None if j == last else 1.0))
    return np.stack(cols, axis=1)


def _design(x: np.ndarray, extras: np.ndarray, knots: np.ndarray) -> np.ndarray:
    return np.concatenate([ramps(x, knots), extras], axis=1)


def _weights(y: np.ndarray, component: str) -> np.ndarray:
    """What each point's error is measured against: its own time (relative error), or for a difference the
    points' mean size."""
    if component in DIFFERENCE_COMPONENTS:
        return np.full_like(y, max(float(np.mean(np.abs(y))), 1e-9))
    return y


def _solve(x, extras, y, knots, weights=None) -> np.ndarray:
    """The curve's coefficients: [value at the first knot, rise over each segment, extras]. Interior
    segments may slope down, but never below zero: a segment whose fall would take the curve below zero
    at its end (a noisy point priced by a large extra term) is held rising instead, and the fit solved
    again."""
    rising: set[int] = set()
    weights = y if weights is None else weights
    while True:
        coef = _solve_once(x, extras, y, knots, rising, weights)
        below = np.flatnonzero(np.cumsum(coef[:len(knots)]) < 0)
        if not len(below):
            return coef
        rising.add(int(below[0]))       # the first knot below zero ends the segment that fell


def _solve_once(x, extras, y, knots, rising: set[int], weights: np.ndarray) -> np.ndarray:
    a = _design(x, extras, knots)
    # Interior segments may slope down: a CPU's matmul can be slower at 3 rows
    # than at 4. A free coefficient is the difference of two non-negative ones.
    # The end segments (which extrapolate), the extras and the segments in
    # `rising` stay non-negative.
    free = np.zeros(a.shape[1], dtype=bool)
    free[2:len(knots) - 1] = True
    free[list(rising)] = False
    a = np.concatenate([a, -a[:, free]], axis=1)
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0               # columns of very different size (pairs vs seqs): solve in unit scale
    coef = nnls(a / scale / weights[:, None], y / weights) / scale
    n = len(free)
    coef[:n][free] -= coef[n:]
    return coef[:n]


def _arrays(points: list[Measurement], component: str):
    main, extra_names = COMPONENT_FEATURES[component]
    x = np.array([p.features[main] for p in points], dtype=float)
    # A feature a point lacks is 0: an older profile's prompts were all fresh (no cached context).
    extras = np.array([[p.features.get(e, 0.0) for e in extra_names] for p in points],
                      dtype=float).reshape(len(points), -1)
    y = np.array([p.median_s if component in DIFFERENCE_COMPONENTS else p.mean_s for p in points], dtype=float)
    return x, extras, y, main, extra_names


def fit_curve(points: list[Measurement], component: str, method: str) -> CurveFit:
    x, extras, y, main, extra_names = _arrays(points, component)
    knots = knots_for(method, x)
    coef = _solve(x, extras, y, knots, _weights(y, component))
    k = len(knots)
    return CurveFit(method=method, main=main, knots=knots.tolist(), values=np.cumsum(coef[:k]).tolist(),
                    extras={name: float(c) for name, c in zip(extra_names, coef[k:])})


def cross_validate(points: list[Measurement], component: str, method: str, seed: int = 0) -> CvError:
    """k-fold relative error of `method` on held-out points (k = min(5, points); leave-one-out when few)."""
    x, extras, y, _, _ = _arrays(points, component)
    n = len(y)
    folds = min(MAX_FOLDS, n)
    if folds < 2:
        return CvError(mean_rel=None, median_rel=None, max_rel=None, folds=0)
    order = np.random.default_rng(seed).permutation(n)
    errors = np.empty(n)
    for fold in range(folds):
        test = order[fold::folds]
        train = np.setdiff1d(order, test)
        knots = knots_for(method, x[train])
        coef = _solve(x[train], extras[train], y[train], knots, _weights(y[train], component))
        pred = np.maximum(_design(x[test], extras[test], knots) @ coef, 0.0)
        errors[test] = np.abs(pred - y[test]) / _weights(y, component)[test]
    return CvError(mean_rel=float(errors.mean()), median_rel=float(np.median(errors)),
                   max_rel=float(errors.max()), folds=folds)


def fit_component(points: list[Measurement], component: str) -> ComponentFit:
    """Both candidates fitted on all points, and the one with the lower CV error chosen."""
    if not points:
        raise ValueError(f"no measurements for component {component!r}")
    candidates = {m: fit_curve(points, component, m) for m in METHODS}
    cv = {m: cross_validate(points, component, m) for m in METHODS}
    scores = {m: (cv[m].mean_rel if cv[m].folds else 0.0) for m in METHODS}
    # Ties (e.g. too few points to tell) go to the straight line: it extrapolates more safely.
    chosen = ("piecewise" if component in FORWARD_COMPONENTS or scores["piecewise"] < scores["linear"]
              else "linear")
    if component in DIFFERENCE_COMPONENTS:
        chosen = "linear"
    residual = None if component in DIFFERENCE_COMPONENTS else residual_sd(points, component, candidates[chosen])
    return ComponentFit(chosen=chosen, candidates=candidates, cv=cv, residual_sd=residual)


def residual_sd(points: list[Measurement], component: str, curve: CurveFit) -> float:
    """RMS of (repetition / prediction - 1) over every raw repetition of every point: what a step's
    time scatters by around the curve (fit error and run-to-run noise together)."""
    x, extras, _, _, names = _arrays(points, component)
    pred = np.maximum(_design(x, extras, np.array(curve.knots)) @ np.concatenate(
        [np.diff(curve.values, prepend=0.0), [curve.extras.get(name, 0.0) for name in names]]), 1e-12)
    residuals = []
    for p, predicted in zip(points, pred):
        # Samples of a per-layer-scaled point are of the 1-layer model: rescale them to its median.
        scale = p.median_s / float(np.median(p.samples_s)) if p.samples_s and np.median(p.samples_s) > 0 else 1.0
        residuals += [s * scale / predicted - 1 for s in (p.samples_s or [p.median_s])]
    return float(np.sqrt(np.mean(np.square(residuals))))


def fit_all(measurements: list[Measurement]) -> dict[str, ComponentFit]:
    by_component: dict[str, list[Measurement]] = {}
    for m in measurements:
        by_component.setdefault(m.component, []).append(m)
    return {name: fit_component(points, name) for name, points in by_component.items()}
