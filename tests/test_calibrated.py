"""The calibrated cost model and the fit behind it, on synthetic profiles (no torch, fast).

Synthetic timings come from known formulas, so the fit must recover them; the
file checks must refuse every kind of damaged or mismatched profile with a
message that names the file and the problem.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.calibrated import CalibratedCostModel
from planner.profile.schema import SHIPPED_PROFILES, profile_path
from planner.cost.shape import CostModel, StepShape, prefill_attn_pairs
from planner.errors import PlannerError
from planner.profile.schema import (COMPONENTS, PROFILE_SCHEMA_VERSION, DeviceInfo, Grid, Measurement, ModelArch,
                                    Profile, load_profile, save_profile)
from planner.profile.validity import check_profile_values
from planner.profile.fit import cross_validate, fit_all, fit_component, nnls


def _m(component, y, **features):
    return Measurement(component=component, features=features, median_s=y, spread=0.0, samples_s=[y])


def synthetic_measurements(noise: float = 0.0, seed: int = 0, cached: bool = True,
                           mixed: bool = False) -> list[Measurement]:
    """Timings from fixed formulas: linear prefill (3 us more per cached token a prompt continues from), a
    decode that gets cheaper per sequence past batch 16. The fresh prompts carry no `context` feature, as
    in a profile written before prompts after a cached context were timed; `cached=False` leaves those
    out altogether. `mixed`: also what decode rows add to a pass over a prompt chunk (6 ms + 1.2 ms a row),
    as a profile times it now."""
    rng = np.random.default_rng(seed)

    def jitter(y):
        return float(y * (1 + noise * rng.standard_normal()))
    ms = []
    for tokens in (16, 64, 256, 512):
        for seqs in (1, 4):
            length = tokens // seqs
            pairs = seqs * length * (length + 1) // 2
            ms.append(_m("prefill", jitter(2e-3 + 1e-5 * tokens + 1e-8 * pairs + 1e-4 * seqs),
                         tokens=tokens, attn_pairs=pairs, seqs=seqs))
        for context in (128, 512) if cached else ():
            pairs = prefill_attn_pairs(tokens, context)
            ms.append(_m("prefill", jitter(2e-3 + 1e-5 * tokens + 1e-8 * pairs + 1e-4 + 3e-6 * context),
                         tokens=tokens, attn_pairs=pairs, seqs=1, context=context))
    for batch in (1, 4, 16, 64):
        for context in (32, 256, 1024):
            per_seq = 1e-3 * min(batch, 16) + 2e-4 * max(batch - 16, 0)     # concave: a kink at 16
            ms.append(_m("decode", jitter(5e-3 + per_seq + 1e-7 * batch * context),
                         seqs=batch, context=batch * context))
    for batch in (1, 4, 16, 64, 256):
        for name, base, slope in (("sched_prefill", 1e-4, 2e-5), ("sched_decode", 5e-5, 1e-5),
                                  ("sample_greedy", 2e-5, 1e-6), ("sample_random", 1e-4, 3e-4)):
            ms.append(_m(name, jitter(base + slope * batch), seqs=batch))
    for rows in (1, 4, 16, 64) if mixed else ():
        ms.append(_m("mixed_decode", jitter(6e-3 + 1.2e-3 * rows), seqs=rows))
    for blocks in (1, 8, 64):
        ms.append(_m("swap", jitter(1e-4 + 2e-5 * blocks), blocks=blocks))
        ms.append(_m("copy", jitter(5e-5 + 1e-6 * blocks), blocks=blocks))
    return ms


def make_profile(measurements=None, model="opt-125m", gpu="cpu") -> Profile:
    measurements = measurements or synthetic_measurements()
    spec = resolve_model(model)
    return Profile(
        schema_version=PROFILE_SCHEMA_VERSION, created="2024-01-01T00:00:00+00:00",
        device=DeviceInfo(gpu=gpu, kind="cpu", device_name="test cpu", memory_bytes=1 << 30,
                          torch_version="x", kernel_backend="torch", threads=1),
        model=ModelArch.of(spec), tp=1, block_size=16, dtype="float32", per_layer_scaling=False,
        grid=Grid(quick=True, prefill_tokens=[16], prefill_seqs=[1], decode_batch=[1], decode_context=[32],
                  host_batch=[1], block_counts=[1], warmup=0, repeats=1, kv_cache_blocks=100),
        measurements=measurements, fit=fit_all(measurements))


@pytest.fixture
def profile_file(tmp_path):
    return save_profile(make_profile(), tmp_path / "cpu" / "opt-125m.json")


# -- fitting ---------------------------------------------------------------------

def test_nnls_matches_least_squares_when_unconstrained_and_clamps_otherwise():
    rng = np.random.default_rng(1)
    a = rng.random((30, 3))
    x_true = np.array([1.0, 2.0, 0.5])
    assert np.allclose(nnls(a, a @ x_true), x_true, atol=1e-9)
    x = nnls(a, a @ np.array([1.0, -2.0, 0.5]))
    assert (x >= 0).all() and x[1] == 0.0


def test_fit_recovers_exact_formulas():
    fits = fit_all(synthetic_measurements())
    assert set(fits) == set(COMPONENTS)
    for name, fit in fits.items():
        assert fit.cv[fit.chosen].mean_rel < 0.02, (name, fit.cv)
    # The decode kink at batch 16 is something only the piecewise curve can follow.
    assert fits["decode"].chosen == "piecewise"
    assert fits["decode"].cv["linear"].mean_rel > 5 * fits["decode"].cv["piecewise"].mean_rel
    assert fits["prefill"].curve.extras["attn_pairs"] == pytest.approx(1e-8, rel=1e-3)
    assert fits["prefill"].curve.extras["context"] == pytest.approx(3e-6, rel=1e-3)


def test_a_profile_without_prompts_after_a_cached_context_prices_none():
    # Measured before such prompts were timed: it still loads and fits, and a cached context costs
    # what it did then (its pairs only).
    fits = fit_all(synthetic_measurements(cached=False))
    assert fits["prefill"].curve.extras["context"] == 0.0
    assert fits["prefill"].cv["piecewise"].mean_rel < 0.02


def test_cross_validation_reports_held_out_error_not_training_error():
    # Pure noise around a constant: any curve fits the training folds, none predicts held-out points.
    rng = np.random.default_rng(3)
    points = [_m("sched_decode", float(1e-3 * (1 + 0.3 * rng.standard_normal())), seqs=b) for b in range(1, 11)]
    cv = cross_validate(points, "sched_decode", "piecewise")
    assert cv.folds == 5 and cv.mean_rel > 0.1


def test_forward_passes_keep_a_knot_at_every_grid_value():
    # A 2-core CPU's prefill: 2 and 3 prompt tokens cost more than 4 (the BLAS path for so few rows).
    times_ms = {1: 38, 2: 55, 3: 65, 4: 50, 8: 55, 16: 59, 64: 110, 256: 311, 512: 589}
    points = [_m("prefill", ms / 1e3, tokens=t, attn_pairs=t * (t + 1) // 2, seqs=1) for t, ms in times_ms.items()]
    fit = fit_component(points, "prefill")
    assert fit.cv["linear"].mean_rel < fit.cv["piecewise"].mean_rel     # cross-validation alone takes the line
    assert fit.chosen == "piecewise"
    model = CalibratedCostModel(make_profile([m for m in synthetic_measurements() if m.component != "prefill"]
                                             + points))
    for t in (2, 3, 4):
        shape = StepShape(prefill_tokens=t, prefill_seqs=1, prefill_attn_pairs=t * (t + 1) // 2)
        assert model.breakdown(shape)["forward"] == pytest.approx(times_ms[t] / 1e3, rel=0.01)


def test_a_noisy_point_never_takes_the_forward_curve_below_zero():
    # A quick profile on a busy 2-core machine (CI, 2026-12-02): 8 prompts of 32 tokens timed during a fast
    # spell, and the attention term the long prompts need, once dragged the prefill curve to -1.9 ms at 256
    # tokens, a profile its own reader refuses. The segment that fell is held rising instead.
    def point(ms, tokens, seqs):
        per = tokens // seqs
        return _m("prefill", ms / 1e3, tokens=tokens, attn_pairs=seqs * per * (per + 1) // 2, seqs=seqs)
    points = [point(38, 1, 1), point(50, 4, 1), point(59, 16, 1), point(110, 64, 1), point(100, 64, 4),
              point(250, 256, 1), point(20, 256, 8), point(1600, 512, 1), point(600, 512, 2)]
    fit = fit_component(points, "prefill")
    for curve in fit.candidates.values():
        assert min(curve.values) >= 0
    assert fit.candidates["piecewise"].values[:3] == pytest.approx([0.038, 0.050, 0.059], rel=0.02)   # short prompts as timed
    check_profile_values(make_profile([m for m in synthetic_measurements() if m.component != "prefill"] + points),
                         "profile.json")


def test_the_fit_prices_a_points_mean_time_not_its_median():
    # Right-skewed repetitions (one slow spell in five): steps add up, so a run of them costs the mean.
    skewed = [1e-3, 1e-3, 1e-3, 1e-3, 2e-3]
    points = [Measurement(component="sched_decode", features={"seqs": b}, median_s=1e-3, spread=1.0,
                          samples_s=skewed) for b in (1, 4, 16)]
    fit = fit_component(points, "sched_decode")
    assert fit.candidates[fit.chosen].values[0] == pytest.approx(1.2e-3)
    # A per-layer-scaled point keeps the 1-layer model's samples: their skew scales the full-model median.
    scaled = Measurement(component="decode", features={"seqs": 1, "context": 32}, median_s=12e-3, spread=1.0,
                         samples_s=skewed, layer_medians_s={"1": 1e-3, "2": 2e-3})
    assert scaled.mean_s == pytest.approx(14.4e-3)


def test_fit_refuses_empty_component():
    with pytest.raises(ValueError, match="no measurements"):
        fit_component([], "prefill")


# -- the cost model ------------------------------------------------------------------

def test_step_time_reproduces_the_formula_and_parts_add_up(profile_file):
    model = CalibratedCostModel.from_file(profile_file, model=resolve_model("opt-125m"), gpu=resolve_gpu("cpu"))
    assert isinstance(model, CostModel)
    assert model.name == f"calibrated({profile_file})"
    tokens, pairs = 300, prefill_attn_pairs(300)
    prefill = StepShape(prefill_seqs=1, prefill_tokens=tokens, prefill_attn_pairs=pairs)
    expected = (2e-3 + 1e-5 * tokens + 1e-8 * pairs + 1e-4) + (1e-4 + 2e-5) + (2e-5 + 1e-6)
    assert model.step_time(prefill) == pytest.approx(expected, rel=0.02)
    decode = StepShape(decode_seqs=8, decode_context=8 * 500, swap_blocks=8, copy_blocks=2)
    parts = model.breakdown(decode)
    assert sum(parts.values()) == pytest.approx(model.step_time(decode))
    assert parts["swap"] == pytest.approx(1e-4 + 2e-5 * 8, rel=0.02)
    assert model.step_time(StepShape()) == 0.0


def test_a_prompt_after_a_cached_context_pays_for_reading_it(profile_file):
    model = CalibratedCostModel.from_file(profile_file)
    fresh = StepShape(prefill_seqs=1, prefill_tokens=64, prefill_attn_pairs=prefill_attn_pairs(64, 400))
    cached = StepShape(prefill_seqs=1, prefill_tokens=64, prefill_attn_pairs=prefill_attn_pairs(64, 400),
                       prefill_context=400)
    assert model.step_time(cached) - model.step_time(fresh) == pytest.approx(3e-6 * 400, rel=0.02)
    # The same in a mixed step: the chunk's cached context is read while decodes run beside it.
    mixed = dict(decode_seqs=8, decode_context=8 * 300)
    assert (model.step_time(StepShape(**{**_fields(cached), **mixed}))
            - model.step_time(StepShape(**{**_fields(fresh), **mixed}))) == pytest.approx(3e-6 * 400, rel=0.02)
    assert model.breakdown(cached)["forward"] - model.breakdown(fresh)["forward"] == pytest.approx(3e-6 * 400,
                                                                                                  rel=0.02)


def test_a_mixed_step_is_the_chunks_pass_and_what_its_decode_rows_were_timed_to_add():
    model = CalibratedCostModel(make_profile(synthetic_measurements(mixed=True)))
    pairs = prefill_attn_pairs(64, 300)
    chunk = StepShape(prefill_seqs=1, prefill_tokens=64, prefill_attn_pairs=pairs, prefill_context=300)
    mixed = StepShape(prefill_seqs=1, prefill_tokens=64, prefill_attn_pairs=pairs, prefill_context=300,
                      decode_seqs=10, decode_context=10 * 500)
    # the rows' price (6 ms + 1.2 ms each), and their keys beyond the 32 a row had when it was timed
    rows = 6e-3 + 1.2e-3 * 10 + 10 * (500 - 32) * 1e-7
    assert model.breakdown(mixed)["forward"] - model.breakdown(chunk)["forward"] == pytest.approx(rows, rel=0.02)


def _fields(shape: StepShape) -> dict:
    return {name: getattr(shape, name) for name in StepShape.__dataclass_fields__}


def test_sampling_mode_picks_the_sampler_curve(profile_file):
    greedy = CalibratedCostModel.from_file(profile_file)
    random_ = CalibratedCostModel.from_file(profile_file, sampling="random")
    shape = StepShape(decode_seqs=64, decode_context=64 * 100)
    assert random_.step_time(shape) - greedy.step_time(shape) == pytest.approx(
        (1e-4 + 3e-4 * 64) - (2e-5 + 1e-6 * 64), rel=0.02)
    with pytest.raises(PlannerError, match="sampling"):
        CalibratedCostModel.from_file(profile_file, sampling="beam")


def test_monotone_and_extrapolates_past_the_grid(profile_file):
    model = CalibratedCostModel.from_file(profile_file)
    times = [model.step_time(StepShape(prefill_seqs=1, prefill_tokens=t, prefill_attn_pairs=prefill_attn_pairs(t)))
             for t in range(1, 4000, 37)]
    assert all(b >= a for a, b in zip(times, times[1:]))
    decode = [model.step_time(StepShape(decode_seqs=b, decode_context=b * 300)) for b in range(1, 600, 7)]
    assert all(b >= a for a, b in zip(decode, decode[1:]))
    # Past the largest batch (64) the last segment's slope continues.
    far = model.step_time(StepShape(decode_seqs=512, decode_context=512))
    assert far > model.step_time(StepShape(decode_seqs=64, decode_context=512)) and math.isfinite(far)


def test_profile_path_honours_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("PLANNER_PROFILE_DIR", raising=False)
    assert profile_path("cpu", "opt-125m") == SHIPPED_PROFILES / "cpu" / "opt-125m.json"   # from any folder
    assert profile_path("cpu", "opt-125m").is_file()
    monkeypatch.setenv("PLANNER_PROFILE_DIR", str(tmp_path))
    assert profile_path("a100-40g", "opt-13b") == tmp_path / "a100-40g" / "opt-13b.json"


# -- refusing bad files ----------------------------------------------------------------

def _rewrite(path, edit):
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.write_text(p.read_text()[:200]), "not valid JSON"),
    (lambda p: p.write_text("[1, 2]"), "expected a JSON object"),
    (lambda p: _rewrite(p, lambda d: d.update(schema_version=PROFILE_SCHEMA_VERSION + 1)), "schema version"),
    (lambda p: _rewrite(p, lambda d: d.pop("device")), "device"),
    (lambda p: _rewrite(p, lambda d: d["fit"].pop("decode")), "no fit for decode"),
    (lambda p: _rewrite(p, lambda d: d["model"].update(num_layers="many")), "model.num_layers"),
    (lambda p: _rewrite(p, lambda d: d.update(surprise=1)), "surprise"),
    (lambda p: _rewrite(p, lambda d: d["fit"]["copy"]["candidates"]["linear"].update(knots=[3.0, 1.0])), "knots"),
])
def test_damaged_files_are_refused(profile_file, damage, message):
    damage(profile_file)
    with pytest.raises(PlannerError, match=message) as err:
        CalibratedCostModel.from_file(profile_file)
    assert str(profile_file) in str(err.value) and "\n" not in str(err.value)


def test_mismatched_model_gpu_or_tp_is_refused(profile_file):
    with pytest.raises(PlannerError, match="describes model 'opt-125m', not 'opt-13b'.*num_layers"):
        CalibratedCostModel.from_file(profile_file, model=resolve_model("opt-13b"))
    with pytest.raises(PlannerError, match="for GPU 'cpu', not 'a100-40g'"):
        CalibratedCostModel.from_file(profile_file, gpu="a100")
    with pytest.raises(PlannerError, match="tensor parallel size 1, not 2"):
        CalibratedCostModel.from_file(profile_file, tp=2)
    with pytest.raises(PlannerError, match="no such file"):
        load_profile(profile_file.parent / "missing.json")


def test_same_architecture_under_another_name_is_accepted(profile_file):
    import dataclasses
    renamed = dataclasses.replace(resolve_model("opt-125m"), name="my-opt-folder")
    CalibratedCostModel.from_file(profile_file, model=renamed)


@pytest.mark.parametrize("chunk,decodes", [(16, 4), (16, 64), (128, 16), (512, 64)])
def test_a_mixed_step_costs_more_than_either_of_its_halves(chunk, decodes):
    """A chunked-prefill step runs its chunk and its decodes in one pass: cheaper than two steps, but
    never cheaper than the decode step of its decodes alone (each decode row still has its LM-head row
    and paged attention), nor than the chunk alone (a profile that did not time what decode rows add)."""
    model = CalibratedCostModel(make_profile())
    pairs = prefill_attn_pairs(chunk, 64)
    prefill = StepShape(prefill_seqs=1, prefill_tokens=chunk, prefill_attn_pairs=pairs)
    decode = StepShape(decode_seqs=decodes, decode_context=decodes * 256)
    mixed = StepShape(prefill_seqs=1, prefill_tokens=chunk, prefill_attn_pairs=pairs, decode_seqs=decodes,
                      decode_context=decodes * 256)
    forward = {name: model.breakdown(shape)["forward"] for name, shape in
               (("prefill", prefill), ("decode", decode), ("mixed", mixed))}
    assert max(forward["prefill"], forward["decode"]) <= forward["mixed"] < forward["prefill"] + forward["decode"]
    assert model.step_time(mixed) == pytest.approx(sum(model.breakdown(mixed).values()))
