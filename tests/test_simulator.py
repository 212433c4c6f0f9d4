"""The SimPy simulator: hand-computed timelines, conservation, allocator comparisons, determinism."""
from __future__ import annotations


import pytest

from engine.core.allocators import make_allocator
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler, SchedulerConfig
from engine.core.sequence import SequenceGroup
from planner.catalog import resolve_gpu, resolve_model
from planner.cost import RooflineCostModel, StepShape
from planner.cost.select import select_cost_model
from planner.cost.shape import step_shape
from planner.errors import PlannerError
from planner.sim import simulate
from planner.deploy.plan import DeploymentPlan
from sim_helpers import sim_plan
from workloads import Trace, TraceRequest, make_trace

OPT_13B, A100 = resolve_model("opt-13b"), resolve_gpu("a100-40g")


class ConstantCost:
    """Every step that computes something takes `seconds`; swaps add `per_swap_block`."""

    name = "constant"

    def __init__(self, seconds: float = 1.0, per_swap_block: float = 0.0) -> None:
        self.seconds, self.per_swap_block = seconds, per_swap_block

    def step_time(self, shape: StepShape) -> float:
        return 0.0 if shape.is_empty else self.seconds + shape.swap_blocks * self.per_swap_block


def tiny_trace(*rows) -> Trace:
    """rows: (id, arrival, prompt_len, output_len[, extra fields])."""
    reqs = [TraceRequest(request_id=r[0], arrival_time=r[1], prompt_len=r[2], output_len=r[3],
                         **(r[4] if len(r) > 4 else {})) for r in rows]
    return Trace(reqs, name="tiny")


def tiny_config(**kw) -> DeploymentPlan:
    base = dict(model=resolve_model("opt-125m"), gpu=A100, block_size=2, num_gpu_blocks=4, num_cpu_blocks=8,
                max_model_len=16)
    return sim_plan(**{**base, **kw})


def times(result, rid):
    rec = next(r for r in result.requests if r.request_id == rid)
    return rec.first_token, rec.token_times, rec.finish


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_tiny_trace_matches_hand_computed_timeline(mode):
    # The scheduler test's scenario (tests/test_scheduler.py), now on the SimPy clock:
    # 4 blocks of 2 tokens; at t=3 A needs a third block, B (arrived last) is preempted.
    trace = tiny_trace(("A", 0.0, 3, 3), ("B", 0.0, 2, 4), ("C", 0.5, 2, 1))
    result = simulate(trace, tiny_config(preemption_mode=mode), ConstantCost())
    assert times(result, "A") == (1, [1, 3, 4], 4)
    assert times(result, "B") == (1, [1, 3, 5, 6], 6)
    assert times(result, "C") == (2, [2], 2)
    steps = result.steps
    assert [(s.start, s.end, s.is_prefill, s.batch_size) for s in steps] == [
        (0, 1, True, 2), (1, 2, True, 1), (2, 3, False, 2), (3, 4, False, 1),
        (4, 5, mode == "recompute", 1), (5, 6, False, 1)]
    assert steps[3].preempted == 1
    assert result.metrics["preemptions"][mode] == 1
    if mode == "swap":   # B's two blocks go out at t=3 and come back at t=4
        assert [s.swapped_blocks for s in steps] == [0, 0, 0, 2, 2, 0]
        assert [sh.swap_blocks for sh in result.shapes] == [0, 0, 0, 2, 2, 0]
    assert result.metrics["normalized_latency"] == pytest.approx((4 / 3 + 6 / 4 + 1.5) / 3)
    assert result.summary()["kv_blocks_used_at_end"] == 0


def test_swap_time_is_charged():
    trace = tiny_trace(("A", 0.0, 3, 3), ("B", 0.0, 2, 4), ("C", 0.5, 2, 1))
    result = simulate(trace, tiny_config(preemption_mode="swap"), ConstantCost(per_swap_block=0.25))
    # Steps 4 and 5 move two blocks each: half a second longer apiece.
    assert [s.end - s.start for s in result.steps] == [1, 1, 1, 1.5, 1.5, 1]
    assert times(result, "B")[2] == 7


def test_idle_engine_wakes_at_arrival_and_same_instant_arrivals_join_the_step():
    # C arrives mid-step; D arrives exactly when that step ends: both join the prefill at t=1.
    # Then nothing is runnable from t=4 until E arrives at t=10.
    trace = tiny_trace(("A", 0.0, 2, 3), ("C", 0.5, 2, 1), ("D", 1.0, 2, 1), ("E", 10.0, 2, 2))
    result = simulate(trace, tiny_config(num_gpu_blocks=16), ConstantCost())
    assert [(s.start, s.is_prefill, s.batch_size) for s in result.steps] == [
        (0, True, 1), (1, True, 2), (2, False, 1), (3, False, 1), (10, True, 1), (11, False, 1)]
    assert times(result, "A") == (1, [1, 3, 4], 4)
    assert times(result, "D") == (2, [2], 2)
    assert times(result, "E") == (11, [11, 12], 12)
    assert result.summary()["simulated_time"] == 12


def test_rejections_are_accounted_for():
    # 20 tokens exceed max_model_len 16; 12 fit the model but not the 8-slot cache.
    trace = tiny_trace(("long", 0.0, 20, 1), ("wide", 0.0, 12, 1), ("ok", 1.0, 2, 2))
    result = simulate(trace, tiny_config(), ConstantCost())
    m = result.metrics
    assert (m["num_submitted"], m["num_completed"], m["num_rejected"]) == (3, 1, 2)
    rejected = {r.request_id for r in result.requests if r.rejected}
    assert rejected == {"long", "wide"}
    assert times(result, "ok") == (2, [2, 3], 3)


def test_a_request_wider_than_max_num_seqs_is_rejected_not_a_hang():
    # As in the live engine: the wide request is rejected on its own, the other runs.
    trace = tiny_trace(("p", 0.0, 2, 2, {"n": 4}), ("ok", 0.0, 2, 2))
    result = simulate(trace, tiny_config(max_num_seqs=2), ConstantCost())
    assert result.metrics["num_rejected"] == 1 and result.metrics["num_completed"] == 1
    assert next(r for r in result.requests if r.request_id == "p").rejected


@pytest.mark.parametrize("allocator", ["paged", "orca-max", "orca-pow2", "orca-oracle"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_conservation_under_memory_pressure(allocator, mode):
    trace = make_trace("sharegpt", num_requests=120, rate=20.0, seed=3)
    config = sim_plan(OPT_13B, A100, allocator=allocator, preemption_mode=mode, num_gpu_blocks=300,
                       num_cpu_blocks=200)
    result = simulate(trace, config, RooflineCostModel(OPT_13B, A100))
    m = result.metrics
    assert m["num_completed"] + m["num_rejected"] == m["num_submitted"] == len(trace)
    assert all(r.finish is not None for r in result.requests)
    assert result.kv_blocks_used_at_end == 0
    assert len(result.steps) == len(result.shapes) == m["num_steps"]
    if allocator == "paged":
        assert m["preemptions"]["total"] > 0     # the small cache really was under pressure
        assert m["preemptions"]["swap" if mode == "swap" else "recompute"] > 0
    # Every completed request produced exactly its trace output length.
    wanted = {r.request_id: r.output_len for r in trace}
    for rec in result.requests:
        if not rec.rejected:
            assert rec.output_len == min(wanted[rec.request_id], config.max_model_len - rec.prompt_len)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_orca_max_never_beats_paged_on_batch_size(seed):
    trace = make_trace("sharegpt", num_requests=150, rate=8.0, seed=seed)
    batch = {}
    for allocator in ("paged", "orca-max"):
        result = simulate(trace, sim_plan(OPT_13B, A100, allocator=allocator), RooflineCostModel(OPT_13B, A100))
        batch[allocator] = result.metrics["mean_batch_size"]
    assert batch["paged"] >= batch["orca-max"]
    assert batch["paged"] > 1.5 * batch["orca-max"]   # the paper's point: several times larger batches


def test_same_seed_same_result_and_another_seed_differs():
    trace = make_trace("parallel", num_requests=60, rate=10.0, seed=0)
    config = sim_plan(OPT_13B, A100, num_gpu_blocks=200)
    cost = RooflineCostModel(OPT_13B, A100)
    a, b = simulate(trace, config, cost, seed=5), simulate(trace, config, cost, seed=5)
    assert a.metrics == b.metrics
    assert a.steps == b.steps and a.shapes == b.shapes
    other = simulate(make_trace("parallel", num_requests=60, rate=10.0, seed=1), config, cost, seed=5)
    assert other.metrics != a.metrics


@pytest.mark.parametrize("workload", ["parallel", "beam"])
def test_parallel_sampling_and_beams_share_blocks(workload):
    trace = make_trace(workload, num_requests=40, rate=4.0, seed=0)
    cost = RooflineCostModel(OPT_13B, A100)
    paged = simulate(trace, sim_plan(OPT_13B, A100), cost)
    oracle = simulate(trace, sim_plan(OPT_13B, A100, allocator="orca-oracle"), cost)
    assert paged.summary()["sharing_saved"] > 0.05
    assert oracle.summary()["sharing_saved"] == pytest.approx(0.0, abs=1e-12)   # contiguous chunks cannot share
    assert sum(s.copy_blocks for s in paged.shapes) > 0                      # copy-on-write happened
    assert paged.metrics["num_completed"] == len(trace)
    # Every request returned n sequences of its full output length.
    wanted = {r.request_id: r.n * r.output_len for r in trace}
    assert all(rec.output_len == wanted[rec.request_id] for rec in paged.requests)


def test_shared_prefix_hits_the_prefix_cache():
    trace = make_trace("prefix", num_requests=40, rate=4.0, seed=0)
    cost = RooflineCostModel(OPT_13B, A100)
    cached = simulate(trace, sim_plan(OPT_13B, A100, enable_prefix_caching=True), cost)
    plain = simulate(trace, sim_plan(OPT_13B, A100), cost)
    assert cached.summary()["prefix_cache_hit_rate"] > 0.3
    assert plain.summary()["prefix_cache_hit_rate"] == 0
    assert sum(s.prefill_tokens for s in cached.shapes) < sum(s.prefill_tokens for s in plain.shapes)


def test_vllm_benchs_prefix_repetition_hits_every_prefix_but_its_first_use():
    # 200 requests over 10 prefixes of 256 tokens (+ 256 of their own), one a second into a roomy cache (none
    # meets another of its prefix still in its prefill): each prefix misses once, so 190 x 256 of the
    # 200 x 512 prompt tokens hit, as vLLM's prefix-cache counters would say
    trace = make_trace("prefix_repetition", num_requests=200, rate=1.0, arrival="constant", seed=0)
    opt_125m = resolve_model("opt-125m")          # (a cache of 63,649 blocks: no prefix is evicted)
    cached = simulate(trace, sim_plan(opt_125m, A100, policy="vllm-v1", enable_prefix_caching=True),
                      RooflineCostModel(opt_125m, A100)).summary()
    assert cached["preemptions"]["total"] == 0       # (a preempted request would hit its own blocks too)
    assert cached["prefix_cache_hit_rate"] == pytest.approx(190 * 256 / (200 * 512))


def test_chatbot_turns_hit_the_cache_through_the_trace_answers():
    # Each turn's prompt holds the previous answer; the simulator must emit that
    # answer for the hit to be real. One conversation at a time, so turns follow
    # one another and the cache keeps the history.
    trace = make_trace("chatbot", num_requests=30, rate=0.05, seed=0)
    result = simulate(trace, sim_plan(OPT_13B, A100, enable_prefix_caching=True), RooflineCostModel(OPT_13B, A100))
    assert result.summary()["prefix_cache_hit_rate"] > 0.2


def test_step_shape_is_read_before_update():
    alloc = make_allocator("paged", block_size=4, num_gpu_blocks=32, max_model_len=64, enable_prefix_caching=True)
    sched = Scheduler(SchedulerConfig(max_model_len=64), alloc)
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    sched.add(SequenceGroup("a", list(range(10)), params, 0.0))
    out = sched.schedule(0.0)
    assert step_shape(out) == StepShape(prefill_seqs=1, prefill_tokens=10, prefill_attn_pairs=55)
    sched.update(out, {s.seq_id: [(1, 0.0)] for s in out.seqs}, 1.0)
    # Same 8-token prefix (two full blocks) is cached: only 3 new tokens after 8 cached.
    sched.add(SequenceGroup("b", list(range(8)) + [7, 7, 7], params, 1.0))
    out = sched.schedule(1.0)
    assert step_shape(out) == StepShape(prefill_seqs=1, prefill_tokens=3, prefill_attn_pairs=3 * 8 + 6,
                                        prefill_context=8)
    sched.update(out, {s.seq_id: [(1, 0.0)] for s in out.seqs}, 2.0)
    out = sched.schedule(2.0)   # decode: a holds 11 tokens, b 12
    assert step_shape(out) == StepShape(decode_seqs=2, decode_context=23,
                                        decode_histogram=(4, 2, 23))   # both in (8, 16]


def test_config_rejects_bad_input():
    with pytest.raises(ValueError, match="block_size 12"):
        sim_plan(OPT_13B, A100, block_size=12)
    with pytest.raises(ValueError, match="allocator"):
        sim_plan(OPT_13B, A100, allocator="buddy")
    with pytest.raises(PlannerError, match="does not fit"):
        sim_plan(resolve_model("opt-66b"), A100)


# -- cost-model selection ------------------------------------------------------------


@pytest.fixture
def fake_calibrated(monkeypatch, tmp_path):
    """A stand-in calibrated cost model with the agreed interface, and profiles filed under tmp_path."""
    from planner.cost import select
    loaded = []

    class CalibratedCostModel:
        def __init__(self, path):
            self.name = f"calibrated({path})"

        @classmethod
        def from_file(cls, path, *, model, gpu, tp=1):
            if "damaged" in str(path):
                raise PlannerError(f"{path}: damaged profile")
            loaded.append((str(path), model.name, gpu.name, tp))
            return cls(path)

    monkeypatch.setattr(select, "CalibratedCostModel", CalibratedCostModel)
    monkeypatch.setattr(select, "profile_path", lambda gpu_name, model_name: tmp_path / gpu_name / f"{model_name}.json")
    return loaded, tmp_path


def test_select_falls_back_to_measured_then_roofline_without_a_profile(fake_calibrated):
    assert select_cost_model(OPT_13B, A100).name.startswith("measured(a100-40g: a100_sxm")
    assert select_cost_model(OPT_13B, resolve_gpu("l4")).name == "roofline(l4)"     # no measured tables


def test_select_uses_the_default_profile_when_present(fake_calibrated):
    loaded, root = fake_calibrated
    path = root / "a100-40g" / "opt-13b.json"
    path.parent.mkdir()
    path.write_text("{}")
    assert select_cost_model(OPT_13B, A100, tp=1).name == f"calibrated({path})"
    assert loaded == [(str(path), "opt-13b", "a100-40g", 1)]


def test_select_loads_an_explicit_profile_and_reports_damage(fake_calibrated, tmp_path):
    given = tmp_path / "mine.json"
    given.write_text("{}")
    assert select_cost_model(OPT_13B, A100, profile=given).name == f"calibrated({given})"
    with pytest.raises(PlannerError, match="no such file"):
        select_cost_model(OPT_13B, A100, profile=tmp_path / "missing.json")
    with pytest.raises(PlannerError, match="a folder; give a profile's .json file in it"):
        select_cost_model(OPT_13B, A100, profile=tmp_path)
    damaged = tmp_path / "damaged.json"
    damaged.write_text("{")
    with pytest.raises(PlannerError, match="damaged"):
        select_cost_model(OPT_13B, A100, profile=damaged)
