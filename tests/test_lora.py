"""LoRA serving in the scheduler, the workloads, the memory plan, the cost model and the simulator.

The engine's own LoRA execution (adapters applied, checked against transformers) is in
tests/test_engine_lora.py.
"""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from typer.testing import CliRunner

from engine.core.block_keys import adapter_name, cache_root, chained_hashes
from engine.core.chunked_scheduler import ChunkedScheduler, VllmBlockManager
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import SchedulerConfig
from engine.core.sequence import SequenceGroup
from engine.deployment import Deployment
from planner import simulate
from planner.catalog import resolve_gpu, resolve_model
from planner.cli import app
from planner.cli.from_vllm import translate
from planner.cost.calibrated import CalibratedCostModel
from planner.cost.lora import LoraPricer, lora_slot_bytes
from planner.cost.shape import StepShape
from planner.deploy.plan import plan_deployment
from planner.errors import PlannerError
from planner.profile.fit import fit_component
from planner.profile.schema import Measurement, load_profile, save_profile
from planner.validation.external import EndpointReading, _adapters_for
from test_calibrated import make_profile, synthetic_measurements
from workloads import Trace, make_trace
from workloads.errors import TraceError

LLAMA_8B = "llama-3.1-8b"


def group(rid: str, lora: int, prompt=None, max_tokens: int = 3, arrival: float = 0.0) -> SequenceGroup:
    return SequenceGroup(rid, prompt or [10 + int(rid)] * 4, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                         arrival, lora_id=lora)


def scheduler(max_loras, caching=False, num_blocks=64):
    cfg = SchedulerConfig(max_model_len=256, max_num_seqs=8, max_num_batched_tokens=64, vllm_v1=True,
                          enable_prefix_caching=caching, max_loras=max_loras)
    return ChunkedScheduler(cfg, VllmBlockManager(4, num_blocks, enable_prefix_caching=caching))


def test_a_request_of_another_adapter_is_passed_over_and_those_behind_it_go_first():
    sched = scheduler(max_loras=1)
    groups = [group("1", 1), group("2", 2), group("3", 1), group("4", 0)]
    for g in groups:
        sched.add(g)
    out = sched.schedule(0.0)
    # adapter 1 takes the one slot; request 2 (adapter 2) waits, 3 (adapter 1) and 4 (the base model) go
    assert [g.request_id for g in out.groups] == ["1", "3", "4"]
    assert out.lora_adapters == 1
    assert [g.request_id for g in sched.waiting] == ["2"]      # still at the head
    now = 1.0
    while groups[1].times.first_scheduled is None:
        sched.update(out, {s.seq_id: [(7, 0.0)] for s in out.sampling_part().seqs}, now)
        out = sched.schedule(now)
        now += 1.0
    # it ran once the adapter-1 requests had finished (both ran 3 steps)
    assert groups[0].finish_reason is not None and groups[2].finish_reason is not None
    assert groups[1].times.first_scheduled == 3.0


def test_passed_over_requests_keep_their_order():
    sched = scheduler(max_loras=1)
    for g in (group("1", 1), group("2", 2), group("3", 3), group("4", 2)):
        sched.add(g)
    out = sched.schedule(0.0)
    assert [g.request_id for g in out.groups] == ["1"]
    assert [g.request_id for g in sched.waiting] == ["2", "3", "4"]


def test_the_same_prompt_under_two_adapters_shares_no_block():
    sched = scheduler(max_loras=2, caching=True)
    prompt = list(range(10, 30))
    first = group("1", 1, prompt)
    sched.add(first)
    out = sched.schedule(0.0)
    sched.update(out, {s.seq_id: [(7, 0.0)] for s in out.sampling_part().seqs}, 1.0)
    again, other, base = group("2", 1, prompt), group("3", 2, prompt), group("4", 0, prompt)
    for g in (again, other, base):
        sched.add(g)
    sched.schedule(1.0)
    assert again.seqs[0].num_computed_tokens == 16          # its own adapter's blocks: 4 full blocks hit
    assert other.seqs[0].num_computed_tokens == 0
    assert base.seqs[0].num_computed_tokens == 0


def test_forgetting_an_adapter_drops_its_blocks_alone_and_the_kept_keys_stay_bounded():
    """The block manager remembers the keys each adapter's blocks were cached under (the engine's remove_lora
    drops them): only that adapter's leave the cache. Keys evicted since are pruned, so over a long run the
    lists stay within twice what the cache holds."""
    sched = scheduler(max_loras=2, caching=True, num_blocks=16)
    manager, now, runs = sched.allocator, 0.0, {0: [], 1: [], 2: []}
    for i in range(30):
        g = group(str(i), i % 3, [i] * 17 + [1, 2, 3], max_tokens=6)
        sched.add(g)
        while g.finish_reason is None:
            out = sched.schedule(now)
            now += 1.0
            sched.update(out, {s.seq_id: [(7, 0.0)] for s in out.sampling_part().seqs}, now)
        runs[i % 3].append(g.seqs[0].token_ids)
        assert manager.adapter_keys_count <= 2 * 16 + 6          # (one step's keys on top)

    def cached(lora: int) -> set[int]:
        keys = {k for tokens in runs[lora]
                for k in chained_hashes(tokens, 4, len(tokens) // 4, cache_root(adapter_name(lora)))}
        return keys & set(manager.gpu.cached)
    before = {lora: cached(lora) for lora in runs}
    assert all(before.values())
    manager.forget_adapter(cache_root(adapter_name(1)))
    assert {lora: cached(lora) for lora in runs} == before | {1: set()}
    assert manager.gpu.num_free() == 15                          # (all free: the null block aside)


def test_an_adapters_blocks_only_the_cpu_tier_still_holds_are_forgotten_too():
    """With a CPU tier, an adapter's blocks evicted from the GPU live on in the tier: pruning keeps their keys
    (every key the caches hold stays known, request after request), and forgetting the adapter drops them there
    too."""
    cfg = SchedulerConfig(max_model_len=256, max_num_seqs=8, max_num_batched_tokens=64, vllm_v1=True,
                          enable_prefix_caching=True, max_loras=2)
    sched = ChunkedScheduler(cfg, VllmBlockManager(4, 16, enable_prefix_caching=True, offload_blocks=64))
    manager, tier, now, runs = sched.allocator, sched.allocator.offload, 0.0, {1: [], 2: []}

    def keys(lora: int) -> set[int]:
        return {k for tokens in runs[lora]
                for k in chained_hashes(tokens, 4, len(tokens) // 4, cache_root(adapter_name(lora)))}
    for i in range(90):
        g = group(str(i), 1 + i % 2, [i] * 17 + [1, 2, 3], max_tokens=6)
        sched.add(g)
        while g.finish_reason is None:
            out = sched.schedule(now)
            now += 1.0
            sched.update(out, {s.seq_id: [(7, 0.0)] for s in out.sampling_part().seqs}, now)
        runs[1 + i % 2].append(g.seqs[0].token_ids)
        held = (keys(1) | keys(2)) & (tier.slots.keys() | manager.gpu.cached.keys())
        assert held <= {k for kept in manager.adapter_keys.values() for k in kept}
        assert manager.adapter_keys_count <= 2 * (16 + 64) + 6
    tier_only = (keys(1) & tier.slots.keys()) - manager.gpu.cached.keys()
    assert tier_only                                      # (the GPU evicted them; the tier kept them)
    others = keys(2) & tier.slots.keys()
    manager.forget_adapter(cache_root(adapter_name(1)))
    assert not keys(1) & (tier.slots.keys() | manager.gpu.cached.keys())
    assert keys(2) & tier.slots.keys() == others


def test_lora_settings_are_checked_as_vllm_checks_them():
    with pytest.raises(ValueError, match="give --enable-lora"):
        Deployment(max_loras=4)
    with pytest.raises(ValueError, match="max_lora_rank 12"):
        Deployment(enable_lora=True, max_lora_rank=12)
    with pytest.raises(ValueError, match="max_loras"):
        Deployment(enable_lora=True, max_loras=0)
    with pytest.raises(ValueError, match="paper"):
        Deployment(enable_lora=True, policy="paper")


def test_adapters_are_assigned_as_vllm_bench_does():
    robin = make_trace("sharegpt", num_requests=10, rate=1.0, loras=3, lora_assignment="round-robin")
    assert [r.lora for r in robin.requests] == [1, 2, 3, 1, 2, 3, 1, 2, 3, 1]
    drawn = make_trace("sharegpt", num_requests=3000, rate=1.0, loras=4, seed=3)
    counts = Counter(r.lora for r in drawn.requests)
    assert set(counts) == {1, 2, 3, 4} and all(650 < c < 850 for c in counts.values())   # uniform: 750 each
    skewed = Counter(r.lora for r in make_trace("sharegpt", num_requests=3000, rate=1.0, loras=4,
                                                lora_skew=1.0).requests)
    assert skewed[1] > skewed[2] > skewed[3] > skewed[4]     # 1/1 : 1/2 : 1/3 : 1/4
    plain = make_trace("sharegpt", num_requests=10, rate=1.0)
    assert drawn.requests[0].prompt_len == make_trace("sharegpt", num_requests=3000, rate=1.0,
                                                      seed=3).requests[0].prompt_len      # lengths unchanged
    assert all(r.lora == 0 for r in plain.requests)


def test_a_conversation_keeps_its_adapter():
    trace = make_trace("chatbot", num_requests=60, rate=2.0, loras=5)
    by_conversation: dict[str, set[int]] = {}
    for r in trace.requests:
        by_conversation.setdefault(r.conversation_id, set()).add(r.lora)
    assert all(len(adapters) == 1 for adapters in by_conversation.values())
    assert len({next(iter(a)) for a in by_conversation.values()}) > 1


@pytest.mark.parametrize("params, message", [({"loras": -1}, "loras"), ({"loras": 2, "lora_assignment": "lru"},
                                                                           "lora_assignment"),
                                              ({"loras": 2, "lora_skew": 5.0}, "lora_skew")])
def test_bad_lora_parameters_are_refused(params, message):
    with pytest.raises(TraceError, match=message):
        make_trace("sharegpt", num_requests=5, rate=1.0, **params)


def test_a_trace_file_carries_each_requests_adapter(tmp_path):
    trace = make_trace("alpaca", num_requests=6, rate=1.0, loras=2)
    path = tmp_path / "t.jsonl"
    trace.save(path)
    assert [r.lora for r in Trace.load(path).requests] == [r.lora for r in trace.requests]


def test_adapter_slots_are_held_beside_the_weights():
    model = resolve_model(LLAMA_8B)
    # vLLM's slot shapes by hand, Llama-3.1-8B (hidden 4096, q 4096, k = v 1024, MLP 14336), rank 16, bf16:
    # q/k/v: 3 A of 4096 and B of 6144 rows; o: 4096 + 4096; gate/up: 2 x 4096 + 2 x 14336; down: 14336 + 4096
    per_layer = 16 * (3 * 4096 + 6144 + 4096 + 4096 + 2 * 4096 + 2 * 14336 + 14336 + 4096)
    assert lora_slot_bytes(model, 1, 16, 2) == 32 * per_layer * 2 == 80 * 2**20
    assert lora_slot_bytes(model, 2, 16, 2) < lora_slot_bytes(model, 1, 16, 2)
    base = plan_deployment(Deployment(model=LLAMA_8B, gpu="h100"))
    lora = plan_deployment(Deployment(model=LLAMA_8B, gpu="h100", enable_lora=True, max_loras=4, max_lora_rank=64))
    slots = 4 * lora_slot_bytes(model, 1, 64, 2)
    assert lora.memory.lora_bytes_per_gpu == slots
    assert lora.memory.weight_bytes_per_gpu == base.memory.weight_bytes_per_gpu + slots
    block = base.memory.block_bytes_per_gpu
    assert base.num_gpu_blocks - lora.num_gpu_blocks in (slots // block, -(-slots // block))


def test_the_kernels_cost_grows_with_adapters_rank_and_tokens_and_nothing_without_adapters():
    model, gpu = resolve_model(LLAMA_8B), resolve_gpu("h100")
    pricer = LoraPricer(model, gpu, tp=1, rank=16, floor_s=3e-6)
    assert pricer.seconds(64, 0) == 0.0
    one, four = pricer.seconds(64, 1), pricer.seconds(64, 4)
    assert 0 < one < four
    assert pricer.seconds(4096, 4) > four
    assert LoraPricer(model, gpu, tp=1, rank=64, floor_s=3e-6).seconds(64, 4) > four
    # 8 kernels a layer, each at least its launch floor
    assert one >= 32 * 8 * 3e-6


def test_a_run_with_adapters_costs_more_and_max_loras_makes_requests_wait():
    load = dict(workload="sharegpt", rate=8, requests=300, seed=1)
    base = simulate(Deployment(model=LLAMA_8B, gpu="h100"), **load).document()
    roomy = simulate(Deployment(model=LLAMA_8B, gpu="h100", enable_lora=True, max_loras=8), params={"loras": 8},
                     **load).document()
    tight = simulate(Deployment(model=LLAMA_8B, gpu="h100", enable_lora=True, max_loras=2), params={"loras": 8},
                     **load).document()
    assert roomy["tpot_mean"] > base["tpot_mean"]
    assert "LoRA" in roomy["cost_model"]
    assert tight["ttft_mean"] > 2 * roomy["ttft_mean"]      # requests wait for a slot of their adapter


def test_the_decode_fast_path_gives_the_step_by_step_results():
    dep = Deployment(model=LLAMA_8B, gpu="h100", enable_lora=True, max_loras=3)
    fast = simulate(dep, workload="sharegpt", rate=8, requests=250, seed=2, params={"loras": 6}).document()
    slow = simulate(dep, workload="sharegpt", rate=8, requests=250, seed=2, params={"loras": 6},
                    step_by_step=True).document()
    for key in ("ttft_mean", "tpot_mean", "e2e_mean", "num_steps", "request_throughput"):
        assert fast[key] == slow[key], key


def test_adapters_without_enable_lora_an_moe_and_a_profile_are_refused():
    with pytest.raises(PlannerError, match="--enable-lora"):
        simulate(Deployment(model=LLAMA_8B, gpu="h100"), workload="sharegpt", rate=4, requests=20,
                 params={"loras": 2})
    with pytest.raises(PlannerError, match="LoRA is modelled for dense transformers"):
        plan_deployment(Deployment(model="qwen3-30b-a3b", gpu="h100", enable_lora=True))
    cpu = Deployment(model="opt-125m", gpu="cpu", enable_lora=True)
    with pytest.raises(PlannerError, match="calibrated profile timed no LoRA adapter"):
        simulate(cpu, workload="alpaca", rate=1, requests=5, cost_model="calibrated", params={"loras": 1})
    # left to choose, the planner passes over the profile (as for a format a profile cannot price)
    doc = simulate(cpu, workload="alpaca", rate=1, requests=5, params={"loras": 1}).document()
    assert doc["cost_model"].startswith("roofline") and "LoRA" in doc["cost_model"]


def test_the_cli_takes_vllms_lora_flags(tmp_path):
    result = CliRunner().invoke(app, ["simulate", "--model", LLAMA_8B, "--gpu", "h100", "--workload", "sharegpt",
                                      "-n", "40", "--rate", "4", "--enable-lora", "--max-loras", "2",
                                      "--max-lora-rank", "32", "-p", "loras=3", "--json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout.splitlines()[0])
    assert doc["deployment"]["enable_lora"] and doc["deployment"]["max_loras"] == 2
    assert doc["memory_plan"]["lora_gib_per_gpu"] == pytest.approx(2 * 160 / 1024)     # 2 slots of rank 32
    assert doc["params"]["trace_params"]["loras"] == 3


def test_from_vllm_carries_the_lora_flags():
    out = translate("vllm serve meta-llama/Llama-3.1-8B-Instruct --enable-lora --max-loras 4 --max-lora-rank 32 "
                    "--lora-modules a=/x b=/y", "vllm bench serve --lora-modules a b a --lora-assignment round-robin "
                    "--ignore-eos", "h100")
    words = out.words
    assert "--enable-lora" in words
    assert words[words.index("--max-loras") + 1] == "4" and words[words.index("--max-lora-rank") + 1] == "32"
    assert "loras=2" in words and "lora_assignment=round-robin" in words
    assert "--lora-modules" in out.ignored


# -- the calibrated model: a profile taken with --enable-lora ---------------------------------------------

def lora_measurements(noise: float, seed: int = 0):
    """What adapters add to a pass, from a known formula (0.5 ms + 20 us a token + 1.5 ms an adapter), each
    point's repetitions scattered by `noise` seconds: differences of two passes, some of them negative."""
    rng = np.random.default_rng(seed)
    points = []
    for tokens in (1, 4, 16, 64, 256):
        for adapters in (1, 2):
            true = 5e-4 + 2e-5 * tokens + 1.5e-3 * adapters
            samples = [float(true + noise * rng.standard_normal()) for _ in range(40)]
            points.append(Measurement(component="lora", features={"tokens": tokens, "adapters": adapters},
                                      median_s=float(np.median(samples)), spread=0.0, samples_s=samples))
    return points


def test_the_difference_fit_recovers_the_adapters_cost_through_negative_samples():
    fit = fit_component(lora_measurements(noise=3e-3), "lora")
    assert fit.chosen == "linear"
    curve = fit.curve
    assert curve.extras["adapters"] == pytest.approx(1.5e-3, rel=0.35)
    slope = (curve.values[-1] - curve.values[0]) / (curve.knots[-1] - curve.knots[0])
    assert slope == pytest.approx(2e-5, rel=0.35)


def test_a_calibrated_profile_with_adapters_prices_them_and_one_without_is_refused(tmp_path):
    profile = make_profile(synthetic_measurements() + lora_measurements(noise=0.0)).model_copy(
        update={"lora_rank": 8})
    path = save_profile(profile, tmp_path / "cpu" / "opt-125m.json")
    cost = CalibratedCostModel.from_file(path)
    step = StepShape(decode_seqs=16, decode_context=16 * 100)
    extra = cost.step_time(StepShape(decode_seqs=16, decode_context=16 * 100, lora_adapters=2)) - cost.step_time(step)
    assert extra == pytest.approx(5e-4 + 2e-5 * 16 + 1.5e-3 * 2, rel=0.02)
    cpu = Deployment(model="opt-125m", gpu="cpu", enable_lora=True, max_lora_rank=8)
    doc = simulate(cpu, workload="alpaca", rate=2, requests=30, params={"loras": 2}, profile=str(path)).document()
    assert doc["cost_model"].startswith("calibrated")
    with pytest.raises(PlannerError, match="timed adapters of rank 8, not of --max-lora-rank 16"):
        simulate(cpu.replace(max_lora_rank=16), workload="alpaca", rate=2, requests=5, params={"loras": 1},
                 profile=str(path))
    damaged = profile.model_copy(update={"lora_rank": None})
    with pytest.raises(PlannerError, match="a LoRA fit and lora_rank come together"):
        load_profile(save_profile(damaged, tmp_path / "damaged.json"))


def test_an_adapter_not_in_the_slots_is_loaded_evicting_the_least_recently_used():
    sched = scheduler(max_loras=2)
    loads = [sched.activate_loras([group("1", lora) for lora in step])[1]
             for step in ([1], [1, 2], [2], [3, 2], [1], [0])]
    # 1 and 2 loaded; 2 alone only touches it; 3 evicts 1, used least recently; 1 comes back and evicts 2 (the
    # step of 3 used 2 first, in id order); the base model needs no slot
    assert loads == [1, 1, 0, 1, 1, 0]
    assert list(sched.lora_slots) == [3, 1]


def test_a_load_is_priced_as_a_slot_copied_over_the_host_link():
    model, gpu = resolve_model(LLAMA_8B), resolve_gpu("h100")
    pricer = LoraPricer(model, gpu, tp=1, rank=16, floor_s=3e-6)
    assert pricer.load_seconds(0) == 0.0
    assert pricer.load_seconds(2) == pytest.approx(2 * 80 * 2**20 / gpu.host_link_bandwidth)


def test_an_endpoint_validation_sends_the_traces_adapters_under_the_servers_names():
    trace = make_trace("alpaca", num_requests=30, rate=1.0, loras=2)
    server = EndpointReading({}, {}, adapters=("sql", "chat", "spare"))
    assert _adapters_for(trace, server, {"enable_lora": True}) == ("sql", "chat")
    assert _adapters_for(make_trace("alpaca", num_requests=5, rate=1.0), server, {}) == ()
    with pytest.raises(PlannerError, match="give --enable-lora"):
        _adapters_for(trace, server, {})
    with pytest.raises(PlannerError, match="adapters 1 to 2, and the server lists 1"):
        _adapters_for(trace, EndpointReading({}, {}, adapters=("sql",)), {"enable_lora": True})
