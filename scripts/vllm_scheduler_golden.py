"""Golden step logs from vLLM 0.19.0's own v1 Scheduler, for tests/test_chunked_vs_vllm.py.

Runs vLLM's synchronous ``vllm.v1.core.sched.scheduler.Scheduler`` on the CPU
with a fake model runner (no model, no GPU): every case of
tests/vllm_replay.py's ``all_cases`` (chunked prefill on and off) is driven
exactly as ``replay`` drives our v1 policy, and the cases with vLLM's step logs are written to
tests/data/vllm_0_19_scheduler_golden.json.

Needs a scratch environment outside this repo, e.g.:
    python -m venv /tmp/vllm-venv && . /tmp/vllm-venv/bin/activate
    pip install torch==2.13.0 && pip install --no-deps vllm==0.19.0
    pip install transformers'<5' pydantic msgspec pyzmq cloudpickle blake3 cbor2 pybase64 gguf aiohttp \
        uvloop openai openai-harmony llguidance diskcache xgrammar regex cachetools psutil einops ...
    python scripts/vllm_scheduler_golden.py MODEL_DIR   # any folder with a Llama config.json
"""
import json, sys, zlib
import torch
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig, DeviceConfig
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.request import Request
from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.utils.hashing import sha256

def make_scheduler(case):
    """vLLM's v1 Scheduler configured as the case says (CPU, one dummy attention
    layer), with the block hasher its requests need for prefix caching."""
    cfg = case["config"]
    bs = cfg["block_size"]
    model_config = ModelConfig(model=MODEL_DIR, skip_tokenizer_init=True, dtype="float32", seed=0,
                               max_model_len=cfg["max_model_len"])
    sched_config = SchedulerConfig(max_num_seqs=cfg["max_num_seqs"], max_num_batched_tokens=cfg["budget"],
                                   max_model_len=cfg["max_model_len"],
                                   enable_chunked_prefill=cfg.get("chunked", True),
                                   long_prefill_token_threshold=cfg.get("threshold", 0),
                                   policy=cfg.get("policy", "fcfs"),
                                   is_encoder_decoder=False, async_scheduling=False,
                                   scheduler_reserve_full_isl=cfg.get("reserve_full_isl", True))
    cache_config = CacheConfig(block_size=bs, gpu_memory_utilization=0.9, cache_dtype="auto",
                               enable_prefix_caching=cfg["caching"])
    cache_config.num_gpu_blocks = cfg["num_blocks"]
    vllm_config = VllmConfig(scheduler_config=sched_config, model_config=model_config, cache_config=cache_config,
                             device_config=DeviceConfig("cpu"))
    kv = KVCacheConfig(num_blocks=cfg["num_blocks"], kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=bs, num_kv_heads=1,
                                                                                       head_size=1, dtype=torch.float32))])
    sched = Scheduler(vllm_config=vllm_config, kv_cache_config=kv, block_size=bs, log_stats=False,
                      structured_output_manager=StructuredOutputManager(vllm_config))
    init_none_hash(sha256)
    return sched, get_request_block_hasher(bs, sha256)


def sampled_tokens(sched, ids):
    """The fake model runner's output: per scheduled request, one token if its
    prompt is done (none for a partial chunk)."""
    sampled = []
    for rid in ids:
        req = sched.requests[rid]
        done_prompt = req.num_computed_tokens >= req.num_tokens   # advanced at schedule time
        # The token a request outputs at position p: fixed by the trace, so both sides agree.
        sampled.append([zlib.crc32(f'{rid}:{req.num_tokens}'.encode()) % 90 + 10] if done_prompt else [])
    return sampled


def finished_ids(engine_core_outputs):
    """Ids of the requests an update_from_output finished."""
    return [o.request_id for outs in engine_core_outputs.values() for o in outs.outputs
            if o.finish_reason is not None]


def run(case):
    """vLLM's step log for one case: requests added as they arrive, each step's
    scheduled tokens, preemptions and finishes, on the case's step-time clock."""
    sched, hasher = make_scheduler(case)
    pending = sorted(case["requests"], key=lambda r: r["arrival"])
    a, b = case["step_time"]
    now, steps, unfinished = 0.0, [], set()
    while pending or unfinished:
        while pending and pending[0]["arrival"] <= now:
            r = pending.pop(0)
            sp = SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True, temperature=0.0)
            sched.add_request(Request(r["id"], r["prompt"], sp, None, arrival_time=r["arrival"],
                                      priority=r.get("priority", 0), block_hasher=hasher))
            unfinished.add(r["id"])
        out = sched.schedule()
        scheduled = dict(out.num_scheduled_tokens)
        if not scheduled:
            if out.preempted_req_ids:
                steps.append({"t": now, "tokens": {}, "preempted": sorted(out.preempted_req_ids)})
                continue
            now = pending[0]["arrival"]
            continue
        ids = list(scheduled)
        sampled = sampled_tokens(sched, ids)
        now += a + b * sum(scheduled.values())
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=sampled)
        finished = finished_ids(sched.update_from_output(out, mro))
        unfinished -= set(finished)
        steps.append({"t": round(now, 9), "tokens": scheduled, "preempted": sorted(out.preempted_req_ids),
                      "finished": sorted(finished)})
        if len(steps) > 100000:
            raise RuntimeError("too many steps")
    return steps

if __name__ == "__main__":
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    sys.path[:0] = [str(root), str(root / "tests")]
    from vllm_replay import all_cases
    MODEL_DIR = sys.argv[1]
    cases = [dict(case, vllm_steps=run(case)) for case in all_cases()]
    out = root / "tests" / "data" / "vllm_0_19_scheduler_golden.json"
    out.write_text(json.dumps({"vllm_version": "0.19.0", "cases": cases}, separators=(",", ":")))
    print(f"wrote {out}: {len(cases)} cases, {sum(len(c['vllm_steps']) for c in cases)} steps")
