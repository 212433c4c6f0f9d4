"""Replay a scheduling case through the chunked policy the way scripts/vllm_scheduler_golden.py
drives vLLM 0.19.0's own v1 Scheduler, so the two step logs can be compared entry for entry.

A case: scheduler knobs, a step time A + B x scheduled tokens, and requests
(id, arrival, prompt token ids, max_tokens). Each step logs its time at the
end, the tokens per request in scheduling order, the preempted and the
finished request ids. The token a request samples is fixed by (id, length),
so both sides build the same sequences and the same prefix-cache hashes.
"""
from __future__ import annotations

import zlib

from engine.core.chunked_scheduler import ChunkedScheduler, VllmBlockManager
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import SchedulerConfig
from engine.core.sequence import SequenceGroup


def sampled_token(request_id: str, num_tokens: int) -> int:
    return zlib.crc32(f"{request_id}:{num_tokens}".encode()) % 90 + 10


def replay(case: dict) -> list[dict]:
    cfg = case["config"]
    bm = VllmBlockManager(cfg["block_size"], cfg["num_blocks"], enable_prefix_caching=cfg["caching"])
    config = SchedulerConfig(max_model_len=cfg["max_model_len"], max_num_seqs=cfg["max_num_seqs"],
                             max_num_batched_tokens=cfg["budget"], vllm_v1=True,
                             enable_chunked_prefill=cfg.get("chunked", True),
                             long_prefill_token_threshold=cfg.get("threshold", 0),
                             scheduling_policy=cfg.get("policy", "fcfs"))
    sched = ChunkedScheduler(config, bm, reserve_full_isl=cfg.get("reserve_full_isl", True))
    pending = sorted(case["requests"], key=lambda r: r["arrival"])
    a, b = case["step_time"]
    now, steps = 0.0, []
    while pending or sched.has_unfinished():
        while pending and pending[0]["arrival"] <= now:
            r = pending.pop(0)
            sched.add(SequenceGroup(r["id"], r["prompt"], SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True),
                                    r["arrival"], priority=r.get("priority", 0)))
        out = sched.schedule(now)
        if out.is_empty:
            if out.preempted:
                steps.append({"t": now, "tokens": {}, "preempted": sorted(g.request_id for g in out.preempted)})
                continue
            now = pending[0]["arrival"]
            continue
        tokens = {g.request_id: n for g, n in zip(out.groups, out.num_scheduled_tokens)}
        sampling = out.sampling_part()
        samples = {s.seq_id: [(sampled_token(g.request_id, s.num_tokens), 0.0)]
                   for g, s in zip(sampling.groups, sampling.seqs)}
        now += a + b * sum(tokens.values())
        finished = sched.update(out, samples, now)
        steps.append({"t": round(now, 9), "tokens": tokens, "preempted": sorted(g.request_id for g in out.preempted),
                      "finished": sorted(g.request_id for g in finished)})
    return steps


def make_cases(seed: int = 0, count: int = 20) -> list[dict]:
    """Small random cases that exercise chunking, tight caches, preemption and prefix hits."""
    import random
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        block_size = rng.choice([4, 8, 16])
        caching = i % 2 == 1
        max_num_seqs = rng.choice([2, 4, 8])
        budget = max(max_num_seqs, rng.choice([8, 16, 32, 64]))
        shared = [rng.randrange(10, 100) for _ in range(rng.choice([0, block_size * 2, block_size * 3 + 1]))]
        requests, t = [], 0.0
        for j in range(rng.randint(5, 14)):
            t += rng.expovariate(4.0)
            prompt_len = rng.randint(1, 60)
            prompt = (shared if caching and rng.random() < 0.6 else []) + [rng.randrange(10, 100)
                                                                            for _ in range(prompt_len)]
            requests.append({"id": f"r{j}", "arrival": round(t, 3), "prompt": prompt,
                             "max_tokens": rng.randint(1, 30)})
        longest = max(len(r["prompt"]) + r["max_tokens"] for r in requests)
        # From barely enough for the longest request to roomy: tight ones preempt.
        num_blocks = -(-longest // block_size) + 1 + rng.choice([0, 1, 2, 4, 40])
        cases.append({"name": f"case{i}", "config": {
            "block_size": block_size, "num_blocks": num_blocks, "budget": budget, "max_num_seqs": max_num_seqs,
            "caching": caching, "max_model_len": 256, "reserve_full_isl": i % 4 != 3},
            "step_time": [0.01, 0.001], "requests": requests})
    return cases


def make_unchunked_cases(seed: int = 1, count: int = 16) -> list[dict]:
    """Cases without chunked prefill (the first 12: a waiting prompt runs whole or waits, the budget holds
    max_model_len) and with long_prefill_token_threshold (every third of those, and the last 4, chunked)."""
    import random
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        block_size = rng.choice([4, 8, 16])
        caching = i % 2 == 1
        chunked = i >= 12
        max_num_seqs = rng.choice([4, 8])
        max_model_len = rng.choice([32, 48, 64])
        budget = max_model_len if not chunked else max(max_num_seqs, rng.choice([8, 16, 32]))
        threshold = rng.choice([4, 8, 12]) if i % 3 == 2 or chunked else 0
        shared = [rng.randrange(10, 100) for _ in range(rng.choice([0, block_size, block_size + 1]))]
        requests, t = [], 0.0
        for j in range(rng.randint(6, 14)):
            t += rng.expovariate(20.0)     # bursts, so prompts meet a budget the decodes have used
            prefix = shared if caching and rng.random() < 0.6 else []
            longest = max_model_len - 2 - len(prefix)
            prompt = prefix + [rng.randrange(10, 100) for _ in range(rng.randint(longest // 3, longest))]
            requests.append({"id": f"r{j}", "arrival": round(t, 3), "prompt": prompt,
                             "max_tokens": rng.randint(1, min(30, max_model_len - len(prompt)))})
        longest = max(len(r["prompt"]) + r["max_tokens"] for r in requests)
        # From one request's worth and a little (preemptions) to several requests' (full budgets).
        num_blocks = -(-longest // block_size) + 1 + rng.choice([1, 4, 16, 40]) * 16 // block_size
        cases.append({"name": f"{'chunked' if chunked else 'unchunked'}{i}", "config": {
            "block_size": block_size, "num_blocks": num_blocks, "budget": budget, "max_num_seqs": max_num_seqs,
            "caching": caching, "max_model_len": max_model_len, "reserve_full_isl": i % 4 != 3,
            "chunked": chunked, "threshold": threshold},
            "step_time": [0.01, 0.001], "requests": requests})
    return cases


def make_priority_cases(seed: int = 2, count: int = 12) -> list[dict]:
    """Cases under --scheduling-policy priority: priorities 0-2 over bursts (the waiting order) and tight
    caches (the preemption victim), chunked prefill on and (every third) off."""
    import random
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        block_size = rng.choice([4, 8, 16])
        caching = i % 2 == 1
        chunked = i % 3 != 2
        max_num_seqs = rng.choice([2, 4, 8])
        max_model_len = 64
        budget = max(max_num_seqs, rng.choice([8, 16, 32])) if chunked else max_model_len
        shared = [rng.randrange(10, 100) for _ in range(rng.choice([0, block_size + 1]))]
        requests, t = [], 0.0
        for j in range(rng.randint(6, 14)):
            t += rng.expovariate(10.0)
            prefix = shared if caching and rng.random() < 0.6 else []
            prompt = prefix + [rng.randrange(10, 100) for _ in range(rng.randint(1, 40 - len(prefix)))]
            # (arrivals never tie: vLLM stamps them by the clock; SequenceGroup.priority_key)
            requests.append({"id": f"r{j}", "arrival": round(t, 3) + j * 1e-6, "prompt": prompt,
                             "max_tokens": rng.randint(1, min(20, max_model_len - len(prompt))),
                             "priority": rng.choice([0, 1, 2])})
        longest = max(len(r["prompt"]) + r["max_tokens"] for r in requests)
        num_blocks = -(-longest // block_size) + 1 + rng.choice([0, 1, 2, 4, 40])
        cases.append({"name": f"priority{i}", "config": {
            "block_size": block_size, "num_blocks": num_blocks, "budget": budget, "max_num_seqs": max_num_seqs,
            "caching": caching, "max_model_len": max_model_len, "reserve_full_isl": i % 4 != 3,
            "chunked": chunked, "policy": "priority"},
            "step_time": [0.01, 0.001], "requests": requests})
    return cases


def all_cases() -> list[dict]:
    """Every case of the golden file, in its order."""
    return make_cases() + make_unchunked_cases() + make_priority_cases()
