"""Private blocks (planner/sim/private_blocks.py): vLLM v1's prefix caching without keying a sampled token.

The claim is that nothing the scheduler does can tell a block manager that registers a request's
sampled blocks only when it is preempted (keyed by the request) from one that registers every
block as it fills (keyed by drawn token ids, as vLLM does): the same requests are scheduled,
preempted and hit, step for step, through preemptions, shared prefixes and conversation turns.
"""
from __future__ import annotations

import pytest

from engine.core.chunked_scheduler import ChunkedScheduler, VllmBlockManager
from engine.core.scheduler import SchedulerOutput
from engine.core.sequence import SequenceStatus
from planner.catalog import resolve_gpu, resolve_model
from planner.sim.private_blocks import PrivateBlockManager
from planner.sim.synthetic import SyntheticExecutor
from sim_helpers import sim_plan
from workloads import Trace, TraceRequest, make_trace

LLAMA, H100 = resolve_model("llama-3.1-8b"), resolve_gpu("h100-sxm")


def drive(trace: Trace, blocks: int, private: bool, block_size: int = 16, offload: int = 0) -> list[tuple]:
    """Every step of vLLM v1's scheduler over `trace` (all requests waiting at once): what it ran,
    preempted and hit, and what it left free; with a CPU tier of `offload` blocks, also the blocks each
    step loaded from and stored to it, and its counters."""
    plan = sim_plan(LLAMA, H100, policy="vllm-v1", enable_prefix_caching=True, max_model_len=1024,
                    max_num_batched_tokens=512, max_num_seqs=24, block_size=block_size)
    allocator = (PrivateBlockManager(block_size, blocks, offload_blocks=offload) if private
                 else VllmBlockManager(block_size, blocks, enable_prefix_caching=True, offload_blocks=offload))
    scheduler = ChunkedScheduler(plan.scheduler_config(), allocator)
    executor = SyntheticExecutor(trace, vocab_size=LLAMA.vocab_size, seed=3, real_token_ids=True,
                                 private_blocks=allocator if private else None)
    assert executor.draws_samples is not private
    for req in trace.requests:
        scheduler.add(executor.make_group(req))
    log, now = [], 0.0
    while scheduler.has_unfinished():
        out = scheduler.schedule(now)
        log.append(([g.request_id for g in out.groups], list(out.num_scheduled_tokens),
                    [g.request_id for g in out.preempted],
                    scheduler.prefix_hit_tokens + scheduler.preempted_hit_tokens,        # (returns counted apart)
                    scheduler.prefix_queried_tokens + scheduler.preempted_queried_tokens,
                    allocator.num_free_blocks(), allocator.token_slots_used(),
                    sorted(out.kv_loads.values()), sorted(out.kv_stores),
                    allocator.offload.stats.as_dict() if offload else None))
        scheduler.update(out, executor.samples(out.sampling_part()), now)
        now += 1.0
    return log


@pytest.mark.parametrize("workload,blocks,block_size", [
    ("sharegpt", 90, 16),      # preempted requests come back and hit their own sampled blocks
    ("prefix", 80, 16),        # shared prefixes, and the block a prompt ends in holding sampled tokens
    ("chatbot", 120, 16),      # turns that hit their history, the trace's answers included
    ("chatbot", 1400, 1),
])
def test_private_blocks_schedule_exactly_as_blocks_keyed_by_their_tokens(workload, blocks, block_size):
    trace = make_trace(workload, num_requests=40, rate=10.0, seed=5)
    trace = Trace([r.model_copy(update={"output_len": min(r.output_len, 300), "prompt_len": min(r.prompt_len, 600)})
                   for r in trace.requests], name=workload)
    keyed = drive(trace, blocks, private=False, block_size=block_size)
    private = drive(trace, blocks, private=True, block_size=block_size)
    assert private == keyed
    assert any(step[2] for step in keyed)           # preemptions happened
    assert keyed[-1][3] > 0                         # and the cache was hit


@pytest.mark.parametrize("workload,blocks,block_size,offload", [
    ("sharegpt", 90, 16, 40),     # preempted requests load their own sampled blocks back; a few stores refused
    ("prefix", 80, 16, 30),
    ("chatbot", 120, 16, 60),     # turns load their history, the trace's answers included
    ("chatbot", 1400, 1, 600),
])
def test_with_a_cpu_tier_private_blocks_are_stored_and_loaded_as_blocks_keyed_by_their_tokens(
        workload, blocks, block_size, offload):
    # --kv-offloading-size: the tier stores every full block, sampled ones too, so a private block is keyed as
    # it fills; its owner, preempted, finds it in the tier under the same key.
    trace = make_trace(workload, num_requests=40, rate=10.0, seed=5)
    trace = Trace([r.model_copy(update={"output_len": min(r.output_len, 300), "prompt_len": min(r.prompt_len, 600)})
                   for r in trace.requests], name=workload)
    keyed = drive(trace, blocks, private=False, block_size=block_size, offload=offload)
    private = drive(trace, blocks, private=True, block_size=block_size, offload=offload)
    assert private == keyed
    assert any(step[2] for step in keyed)           # preemptions happened
    assert keyed[-1][9]["blocks_loaded"] > 0        # and the tier was hit


def test_a_preempted_request_comes_back_to_its_own_sampled_blocks_and_a_finished_one_keys_none():
    allocator = PrivateBlockManager(4, 64)
    plan = sim_plan(LLAMA, H100, policy="vllm-v1", enable_prefix_caching=True, max_model_len=128,
                    max_num_batched_tokens=64, max_num_seqs=4, block_size=4)
    scheduler = ChunkedScheduler(plan.scheduler_config(), allocator)
    trace = Trace([TraceRequest(request_id="a", arrival_time=0.0, prompt_len=10, output_len=20)], name="one")
    executor = SyntheticExecutor(trace, vocab_size=LLAMA.vocab_size, seed=0, real_token_ids=True,
                                 private_blocks=allocator)
    group = executor.make_group(trace.requests[0])
    scheduler.add(group)
    for step in range(9):              # the prompt, then 8 sampled tokens: 17 computed, 4 full blocks
        out = scheduler.schedule(float(step))
        scheduler.update(out, executor.samples(out.sampling_part()), float(step))
    seq = group.seqs[0]
    assert seq.output_token_ids == [0] * 9                  # constant samples, nothing drawn
    assert group.prompt_token_ids == [-1] * 10                # its prompt: one id no token and no other request has
    assert not allocator.gpu.cached                         # nothing keyed while it runs, its prompt neither
    scheduler.running.remove(group)
    scheduler._preempt(group, {})                           # as vLLM v1 preempts it by recompute
    assert len(allocator.gpu.cached) == 4                   # its prompt's and sampled blocks, keyed by the request
    hit = allocator.cached_prefix(seq)
    assert len(hit) == 4                                    # it comes back to all of them
    while scheduler.has_unfinished():
        out = scheduler.schedule(float(step))
        scheduler.update(out, executor.samples(out.sampling_part()), float(step))
    assert scheduler.preempted_hit_tokens == 16 and scheduler.preempted_queried_tokens == 19   # 10 + 9 sampled
    assert scheduler.prefix_hit_tokens == 0 and scheduler.prefix_queried_tokens == 10   # vLLM's hit rate: 0
    assert len(allocator.gpu.cached) == 4                   # finished: its later blocks never keyed
    assert not allocator.public and not allocator.own_prompts


def test_a_prompt_is_its_requests_own_unless_it_is_shared():
    """Only a plain prompt of one sample is private: a shared prefix, a conversation turn and a request
    fanned out into n children (which share its prompt's blocks) keep ids that other requests can hit."""
    plain = [TraceRequest(request_id=f"r{i}", arrival_time=0.0, prompt_len=40, output_len=8) for i in range(3)]
    trace = Trace([*plain,
                   TraceRequest(request_id="n3", arrival_time=0.0, prompt_len=40, output_len=8, n=3),
                   TraceRequest(request_id="p", arrival_time=0.0, prompt_len=40, output_len=8, prefix_id="sys",
                                prefix_len=32)], name="mixed")
    allocator = PrivateBlockManager(16, 64)
    executor = SyntheticExecutor(trace, vocab_size=LLAMA.vocab_size, seed=0, real_token_ids=True,
                                 private_blocks=allocator)
    groups = [executor.make_group(req) for req in trace.requests]
    seqs = [g.seqs[0] for g in groups]
    assert [g.prompt_token_ids[0] for g in groups[:4]] == [-1, -2, -3, -4]     # one id each, the trace's order
    assert [allocator._private_from(s) for s in seqs] == [0, 0, 0, 40 // 16, 40 // 16]
    assert groups[4].prompt_token_ids == trace.prompt_token_ids(trace.requests[4], LLAMA.vocab_size, 0)


def test_a_replica_running_another_replicas_request_samples_the_same_answer():
    trace = make_trace("chatbot", num_requests=6, rate=10.0, seed=1)
    maker_blocks, runner_blocks = PrivateBlockManager(16, 200), PrivateBlockManager(16, 200)
    maker = SyntheticExecutor(trace, vocab_size=LLAMA.vocab_size, seed=0, real_token_ids=True,
                              private_blocks=maker_blocks)
    runner = SyntheticExecutor(trace, vocab_size=LLAMA.vocab_size, seed=0, real_token_ids=True,
                               private_blocks=runner_blocks)
    runner.share_answers(maker)
    req = next(r for r in trace.requests if r.conversation_id is not None)
    group = maker.make_group(req)
    seq = group.seqs[0]
    assert runner_blocks._private_from(seq) is None         # its answer's blocks are keyed by their tokens
    seq.num_computed_tokens, seq.status = seq.num_tokens, SequenceStatus.RUNNING
    out = SchedulerOutput(False, [group], [seq], seq.num_tokens)
    assert runner.samples(out)[seq.seq_id] == [(maker.answers[req.request_id][0], -1.0)]
