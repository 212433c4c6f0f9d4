"""The decode batch (planner/sim/batch.py) gives exactly the step-by-step simulation, under both policies.

The batch keeps the running requests' proof across arrivals and finishes and writes their
tokens lazily, and vLLM v1's mixed steps go through it: every case compares the records,
shapes and metrics with step-by-step simulation, at production-like load and in small caches
where the batch must hand the scheduler back for preemptions, rejections and prompt chunks.
"""
from __future__ import annotations

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost import RooflineCostModel
from planner.cost.measured import MeasuredCostModel
from planner.sim import simulate
from planner.sim.batch import DecodeBatch
from sim_helpers import sim_plan
from workloads import Trace, TraceRequest, make_trace

LLAMA, H100 = resolve_model("llama-3.1-8b"), resolve_gpu("h100-sxm")
MEASURED = MeasuredCostModel(LLAMA, H100)
OPT_13B, A100 = resolve_model("opt-13b"), resolve_gpu("a100-40g")
ROOFLINE = RooflineCostModel(OPT_13B, A100)


def both(trace, cost, model, gpu, **knobs):
    concurrency = knobs.pop("concurrency", None)
    plan = sim_plan(model, gpu, **knobs)
    fast = simulate(trace, plan, cost, concurrency=concurrency)
    slow = simulate(trace, plan, cost, concurrency=concurrency, fast_forward=False)
    assert fast.requests == slow.requests
    assert fast.steps == slow.steps
    assert fast.shapes == slow.shapes and fast.num_running == slow.num_running
    assert fast.summary() == slow.summary()
    return fast


@pytest.mark.parametrize("policy", ["paper", "vllm-v1"])
def test_production_load_is_taken_in_bulk_and_equals_step_by_step(policy):
    trace = make_trace("sharegpt", duration=20, rate=16.0, seed=4)
    fast = both(trace, MEASURED, LLAMA, H100, policy=policy, max_model_len=8192)
    assert fast.fast_forwarded_steps > 0.85 * len(fast.steps)
    if policy == "vllm-v1":       # its mixed steps too: all but the first
        assert fast.fast_forwarded_steps >= len(fast.steps) - 5


@pytest.mark.parametrize("policy,blocks", [("paper", 300), ("vllm-v1", 300), ("paper", 120), ("vllm-v1", 150)])
def test_small_caches_hand_back_and_take_over_again(policy, blocks):
    # Preemptions, admissions blocked by memory, recomputed prompts: the batch gives the
    # scheduler back and builds itself again.
    trace = make_trace("sharegpt", num_requests=80, rate=8.0, seed=1)
    fast = both(trace, ROOFLINE, OPT_13B, A100, policy=policy, num_gpu_blocks=blocks, num_cpu_blocks=0,
                max_model_len=2048)
    assert fast.metrics.preemptions["total"] > 0
    assert fast.fast_forwarded_steps > len(fast.steps) // 3


@pytest.mark.parametrize("block_size", [1, 8, 32])
@pytest.mark.parametrize("policy", ["paper", "vllm-v1"])
def test_other_block_sizes_batch_limits_and_budgets(policy, block_size):
    trace = make_trace("sharegpt", num_requests=60, rate=12.0, seed=2)
    knobs = dict(max_num_seqs=10, max_model_len=2048, block_size=block_size)
    if policy == "vllm-v1":
        knobs["max_num_batched_tokens"] = 256        # long prompts go in chunks, a running prompt stops the batch
    fast = both(trace, MEASURED, LLAMA, H100, policy=policy, **knobs)
    assert fast.fast_forwarded_steps > len(fast.steps) // 3


@pytest.mark.parametrize("blocks", [None, 150])
def test_a_chunk_cap_keeps_the_batch_exact(blocks):
    # vLLM's long_prefill_token_threshold: prompts go in chunks of at most 64 tokens, beside the batch's decodes
    trace = make_trace("sharegpt", num_requests=80, rate=12.0, seed=3)
    knobs = {"num_gpu_blocks": blocks} if blocks else {}
    fast = both(trace, ROOFLINE, OPT_13B, A100, policy="vllm-v1", max_model_len=2048,
                long_prefill_token_threshold=64, **knobs)
    assert all(shape.prefill_tokens <= 64 * shape.prefill_seqs for shape in fast.shapes)
    assert any(shape.prefill_seqs >= 2 for shape in fast.shapes)
    assert fast.fast_forwarded_steps > len(fast.steps) // 4


@pytest.mark.parametrize("workload,budget,knobs", [
    ("sharegpt", 1024, {}), ("sharegpt", 1024, {"num_gpu_blocks": 150}),
    ("sharegpt", 1024, {"long_prefill_token_threshold": 64}), ("prefix", 256, {"enable_prefix_caching": True})])
def test_without_chunked_prefill_the_batch_stays_exact(workload, budget, knobs):
    # vLLM v1 with --no-enable-chunked-prefill: a prompt more than the budget the decodes leave waits, whole
    trace = make_trace(workload, num_requests=80, rate=200.0, seed=5)      # bursts: prompts share a budget
    base = dict(policy="vllm-v1", max_model_len=budget, max_num_batched_tokens=budget, **knobs)
    fast = both(trace, ROOFLINE, OPT_13B, A100, enable_chunked_prefill=False, **base)
    chunked = simulate(trace, sim_plan(OPT_13B, A100, **base), ROOFLINE)
    assert fast.steps != chunked.steps                      # the rule binds
    assert fast.fast_forwarded_steps > len(fast.steps) // 4


@pytest.mark.parametrize("blocks", [None, 150])
def test_priority_scheduling_keeps_the_batch_exact(blocks):
    # vLLM's --scheduling-policy priority with a third of the requests at priority 1: the waiting order and,
    # in the small cache, the preemption victims are the scheduler's own; the batch must not reorder them
    trace = make_trace("sharegpt", num_requests=80, rate=12.0, seed=3, low_priority_share=0.3)
    knobs = {"num_gpu_blocks": blocks} if blocks else {}
    fast = both(trace, ROOFLINE, OPT_13B, A100, policy="vllm-v1", max_model_len=2048, scheduling_policy="priority",
                **knobs)
    assert fast.metrics.preemptions["total"] > 0          # (the 40 GB A100 holds few blocks of OPT-13B)
    assert fast.fast_forwarded_steps > len(fast.steps) // 4


@pytest.mark.parametrize("policy", ["paper", "vllm-v1"])
def test_context_limit_one_token_outputs_and_same_time_arrivals(policy):
    reqs = [TraceRequest(request_id=f"r{i}", arrival_time=0.05 * (i // 3), prompt_len=30 + 7 * i,
                         output_len=1 if i % 5 == 0 else 400) for i in range(30)]
    fast = both(Trace(reqs, name="edge"), MEASURED, LLAMA, H100, policy=policy, max_model_len=256)
    assert {r.output_len for r in fast.requests} >= {1}
    assert any(r.seq_output_len < 400 and r.truncated for r in fast.requests)   # clipped at the context limit


@pytest.mark.parametrize("policy", ["paper", "vllm-v1"])
def test_closed_loop_and_mixed_workloads(policy):
    trace = make_trace("sharegpt", num_requests=60, rate=1.0, seed=3)
    both(trace, MEASURED, LLAMA, H100, policy=policy, max_model_len=4096, concurrency=12)
    if policy == "paper":                  # parallel sampling: outside the batch, stepped as before
        both(make_trace("parallel", num_requests=40, rate=6.0, seed=3), ROOFLINE, OPT_13B, A100, policy=policy)


@pytest.mark.parametrize("policy,caching,private,covered", [
    ("paper", False, False, True), ("paper", True, False, False), ("vllm-v1", False, False, True),
    ("vllm-v1", True, True, True),
    ("vllm-v1", True, False, False),     # blocks of drawn tokens keyed by their ids: not proven
])
def test_the_batch_covers_the_paged_cache_and_vllm_v1s_prefix_caching(policy, caching, private, covered):
    from engine.core.allocators import make_allocator
    from engine.core.chunked_scheduler import VllmBlockManager, make_scheduler
    from planner.sim.batch import covers
    from planner.sim.private_blocks import PrivateBlockManager
    from planner.sim.synthetic import SyntheticExecutor

    plan = sim_plan(OPT_13B, A100, policy=policy, enable_prefix_caching=caching)
    if policy == "paper":
        allocator = make_allocator("paged", block_size=16, num_gpu_blocks=100, max_model_len=2048,
                                   enable_prefix_caching=caching)
    elif private:
        allocator = PrivateBlockManager(16, 100)
    else:
        allocator = VllmBlockManager(16, 100, enable_prefix_caching=caching)
    scheduler = make_scheduler(plan.scheduler_config(), allocator)
    executor = SyntheticExecutor(make_trace("fixed", num_requests=2, rate=1.0), vocab_size=100, seed=0,
                                 real_token_ids=caching, private_blocks=allocator if private else None)
    assert covers(scheduler, executor) is covered
    assert DecodeBatch.build(scheduler, executor, histogram=True) is None     # nothing runs yet
    if caching and policy == "vllm-v1":       # a prefix-aware router reads the cache's events: from the plans
        allocator.gpu.events = []             # of an engine that can give them (not a lockstep group's rank)
        assert covers(scheduler, executor) is covered and not covers(scheduler, executor, events=False)


def token_records(result_of):
    """Run `result_of()` and return its result with every request's sampled tokens, log-probabilities
    and cumulative log-probability (what the records do not hold)."""
    import planner.sim.engine as sim_engine

    seen = []
    check = sim_engine.check_all_ended

    def keep(groups, total):
        seen.extend((tuple(s.token_ids), tuple(s.output_logprobs), s.cumulative_logprob)
                    for g in groups for s in g.seqs)
        check(groups, total)

    sim_engine.check_all_ended = keep
    try:
        return result_of(), seen
    finally:
        sim_engine.check_all_ended = check


@pytest.mark.parametrize("workload,knobs", [
    ("sharegpt", {"max_model_len": 8192}),                                     # production load, no hits
    ("sharegpt", {"max_model_len": 2048, "num_gpu_blocks": 300, "max_num_seqs": 40}),  # recomputed prompts
    ("chatbot", {"max_model_len": 4096}),                          # turns hit their history, answers included
    ("chatbot", {"max_model_len": 2048, "num_gpu_blocks": 400, "block_size": 1}),
    ("prefix", {"max_model_len": 2048, "num_gpu_blocks": 400, "max_num_seqs": 32}),
])
def test_prefix_caching_tokens_equal_step_by_step(workload, knobs):
    # vLLM v1 with prefix caching (its default): the batch writes the members' tokens (the constant, or
    # the trace's answers) and registers the blocks answers fill; records and tokens all match.
    trace = make_trace(workload, duration=30, rate=16.0, seed=4)
    plan = sim_plan(LLAMA, H100, policy="vllm-v1", enable_prefix_caching=True, **knobs)
    fast, fast_tokens = token_records(lambda: simulate(trace, plan, MEASURED))
    slow, slow_tokens = token_records(lambda: simulate(trace, plan, MEASURED, fast_forward=False))
    assert fast.requests == slow.requests and fast.steps == slow.steps and fast.shapes == slow.shapes
    assert fast.summary() == slow.summary()
    assert fast_tokens == slow_tokens
    assert fast.fast_forwarded_steps > len(fast.steps) // 2
    if workload != "sharegpt" and not fast.summary()["preemptions"]["total"]:
        assert fast.prefix_cache_hit_rate > 0
    if workload == "sharegpt":
        # no prompt shares another's blocks; a preempted request's return finds its own (the small cache's runs
        # preempt hundreds), which vLLM's hit rate leaves out (it records them apart, as preempted_hits)
        assert fast.prefix_cache_hit_rate == 0


def test_prefix_caching_long_plans_and_outputs():
    # Plans of hundreds of steps and a prompt whose blocks a running request's answer fills (a chatbot
    # turn arriving while the turn before still decodes).
    reqs = [TraceRequest(request_id=f"r{i}", arrival_time=0.01 * i, prompt_len=100 + 37 * i,
                         output_len=1500 + 211 * i) for i in range(6)]
    reqs += make_trace("chatbot", num_requests=30, rate=20.0, seed=8).requests
    trace = Trace(sorted(reqs, key=lambda r: r.arrival_time), name="long")
    plan = sim_plan(LLAMA, H100, policy="vllm-v1", max_model_len=4096, enable_prefix_caching=True)
    fast, fast_tokens = token_records(lambda: simulate(trace, plan, MEASURED))
    slow, slow_tokens = token_records(lambda: simulate(trace, plan, MEASURED, fast_forward=False))
    assert fast.requests == slow.requests and fast.steps == slow.steps and fast.summary() == slow.summary()
    assert fast_tokens == slow_tokens
    assert fast.fast_forwarded_steps > len(fast.steps) // 2


def test_a_turn_hitting_the_block_a_decoding_answer_just_filled():
    # Turns that arrive while the turn before still decodes (a trace's times say so): the new prompt hits
    # every block the answer has filled, the last one full at this very step, and the batch writes a
    # member's last fill lazily. Admission must not read that fill (it counted 15 token states twice).
    trace = make_trace("chatbot", num_requests=60, rate=8.0, seed=2, time_per_token=0.002, think_time=0.05)
    fast = both(trace, MEASURED, LLAMA, H100, policy="vllm-v1", enable_prefix_caching=True, max_model_len=4096)
    assert fast.prefix_cache_hit_rate > 0 and fast.fast_forwarded_steps > len(fast.steps) // 2


# 60 prefixes of 1,024 tokens, 3,840 blocks of them, for 2,000-block caches: decode steps evict them
PREFIXES = {"num_prefixes": 60, "prefix_len": 1024, "suffix_len": 64, "output_len": 256}


@pytest.mark.parametrize("workload,router,blocks,bulk", [
    ("chatbot", "round-robin", None, 0.5), ("chatbot", "least-requests", None, 0.5),
    ("chatbot", "prefix-aware", None, 0.9),     # members sampling the trace's answers: their blocks registered too
    ("prefix_repetition", "prefix-aware", 2000, 0.9),   # prefixes evicted mid-plan: the router reads plans in flight
    ("prefix_repetition", "weighted:least-kv=1,prefix-aware=3", 2000, 0.9),
    ("sharegpt", "prefix-aware", None, 0.9),
])
def test_prefix_caching_fleets_equal_step_by_step(workload, router, blocks, bulk):
    # A prefix-aware router reads each replica's KV events as its steps published them: from a decode plan in
    # flight, the cached blocks its steps before the arrival took off the free queue and the answers' blocks
    # they registered.
    from planner.sim.fleet import simulate_fleet
    from planner.sim.router import parse_router

    params = PREFIXES if workload == "prefix_repetition" else {}
    trace = make_trace(workload, duration=20, rate=24.0 if workload == "sharegpt" else 8.0, seed=6, **params)
    knobs = {"num_gpu_blocks": blocks} if blocks else {}
    plan = sim_plan(LLAMA, H100, policy="vllm-v1", max_model_len=4096, enable_prefix_caching=True, **knobs)
    runs = [simulate_fleet(trace, plan, MEASURED, replicas=3, router=parse_router(router), seed=0, fast_forward=fast)
            for fast in (True, False)]
    assert runs[0].requests == runs[1].requests and runs[0].steps == runs[1].steps
    assert runs[0].fleet.routes == runs[1].fleet.routes
    assert runs[0].summary() == runs[1].summary()
    assert runs[0].fast_forwarded_steps >= bulk * len(runs[0].steps)


@pytest.mark.parametrize("workload,knobs,size", [
    ("sharegpt", {"max_model_len": 8192}, 4.0),                       # production load: the tier only stores
    ("sharegpt", {"max_model_len": 2048, "num_gpu_blocks": 300, "max_num_seqs": 40}, 0.25),  # loads back preempted
    ("chatbot", {"max_model_len": 4096, "num_gpu_blocks": 600}, 1.0),  # turns load their history from it
    ("chatbot", {"max_model_len": 4096, "num_gpu_blocks": 600}, 0.02),  # a tier of 10 blocks: stores refused
    ("sharegpt", {"max_model_len": 8192}, 0.005),      # of 2 blocks: a decode's one block refused, then offered again
    ("chatbot", {"max_model_len": 512, "num_gpu_blocks": 600, "block_size": 1, "async_scheduling": True}, 0.005),
    ("prefix", {"max_model_len": 2048, "num_gpu_blocks": 400, "max_num_seqs": 32}, 0.05),
])
def test_a_cpu_kv_tier_keeps_the_batch_exact(workload, knobs, size, monkeypatch):
    # --kv-offloading-size: the batch takes each step's blocks and writes the tier as it plans the step, so its
    # stores price the step (here at 2 ms a block, so that each one shows) and every later lookup sees them.
    # The tier itself is compared too: its slots in LRU order at the start of every step (a waiting request's
    # lookups reorder them without changing any record for a while).
    from engine.core.kv_offload import CpuKvTier
    from planner.cost.offload import OffloadCost

    states, complete = [], CpuKvTier.complete_stores

    def logged(tier):
        states.append(tuple(tier.slots.values()))
        complete(tier)

    monkeypatch.setattr(CpuKvTier, "complete_stores", logged)
    trace = make_trace(workload, duration=30 if knobs.get("block_size", 16) > 1 else 5, rate=16.0, seed=4)
    plan = sim_plan(LLAMA, H100, policy="vllm-v1", kv_offloading_size=size, **knobs)
    cost = OffloadCost(MEASURED, 0.002)
    fast, fast_tokens = token_records(lambda: simulate(trace, plan, cost))
    fast_states, states[:] = states[:], []
    slow, slow_tokens = token_records(lambda: simulate(trace, plan, cost, fast_forward=False))
    assert fast.requests == slow.requests and fast.steps == slow.steps and fast.shapes == slow.shapes
    assert fast.summary() == slow.summary()
    assert fast_tokens == slow_tokens
    assert fast_states == states
    assert fast.fast_forwarded_steps > 0.9 * len(fast.steps)
    assert fast.summary()["kv_offload"]["blocks_stored"] > 0
    if size <= 0.02:
        assert fast.summary()["kv_offload"]["stores_refused"] > 0


@pytest.mark.parametrize("workload,blocks,size,router,bulk", [
    ("chatbot", 600, 0.5, "least-requests", 0.9),   # turns load their history, answers' blocks keyed by their tokens
    ("sharegpt", None, 4.0, "least-kv", 0.9),       # production load: private blocks, the tier only stores
    ("sharegpt", None, 0.1, "least-kv", 0.7),       # a tier of 51 blocks: full, stores evict, some refused
    ("sharegpt", None, 0.0025, "least-kv", 0.03),   # of 1 block: a step's decodes fill more than it holds
    ("chatbot", 300, 1.0, "least-requests", 0.9),   # the waiting head blocked on memory: its lookups reorder the tier
    ("chatbot", 600, 0.5, "prefix-aware", 0.9),     # the router reads the blocks a plan in flight registers
    ("prefix_repetition", 600, 1.0, "prefix-aware", 0.9),
])
def test_a_fleet_with_a_cpu_kv_tier_takes_its_replicas_steps_in_bulk(workload, blocks, size, router, bulk,
                                                                    monkeypatch):
    # A routed replica's plan is cut when a request reaches it mid-plan: with a tier the plan foresees its
    # stores and the tier is written as the steps are taken, in LRU order as step by step writes it. A plan
    # stops where it cannot foresee them (a member's stores refused and offered again: the 1-block tier).
    # (Round-robin routes ahead of time: its replicas' plans are never cut.)
    from engine.core.kv_offload import CpuKvTier
    from planner.cost.offload import OffloadCost
    from planner.sim.fleet import simulate_fleet
    from planner.sim.router import parse_router

    tiers, complete, make = [], CpuKvTier.complete_stores, CpuKvTier.__init__

    def made(tier, *args):
        make(tier, *args)
        tiers.append((tier, []))            # a replica's tier, its slots at the start of each step

    def logged(tier):
        next(states for t, states in tiers if t is tier).append(tuple(tier.slots.values()))
        complete(tier)

    monkeypatch.setattr(CpuKvTier, "__init__", made)
    monkeypatch.setattr(CpuKvTier, "complete_stores", logged)
    trace = make_trace(workload, duration=40, rate=24.0, seed=6)
    knobs = {"num_gpu_blocks": blocks} if blocks else {}
    plan = sim_plan(LLAMA, H100, policy="vllm-v1", max_model_len=4096, kv_offloading_size=size, **knobs)
    runs = []
    for fast in (True, False):
        tiers.clear()
        runs.append((simulate_fleet(trace, plan, OffloadCost(MEASURED, 0.002), replicas=2,
                                    router=parse_router(router), seed=0, fast_forward=fast),
                     [states for _, states in tiers]))
    (fast, fast_states), (slow, slow_states) = runs
    assert fast.requests == slow.requests and fast.steps == slow.steps and fast.shapes == slow.shapes
    assert fast.summary() == slow.summary()
    assert len(fast_states) == 2 and fast_states == slow_states
    assert fast.fast_forwarded_steps > bulk * len(fast.steps)
    offload = fast.summary()["kv_offload"]
    assert offload["blocks_stored"] > 2 * offload["cpu_blocks"] if size < 1 else offload["blocks_stored"] > 0
