"""bench/bench_public_qwen3_8b.py simulates a public sweep of vLLM 0.18 serving Qwen3-8B on one H100 as each run
was made: the server's flags as Deployment fields, the load as vllm bench sent it (a rate with a limit on
requests in flight, served clients); the memory plan holds what each server logged."""

from pathlib import Path

import pytest

from engine.deployment import Deployment
from planner.deploy.plan import plan_deployment
from planner.sim.clients import SERVED_TURNAROUND

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_public_qwen3_8b.py"
BASE = ("vllm serve Qwen/Qwen3-8B --host 0.0.0.0 --port 8000 --dtype auto --gpu-memory-utilization 0.95 "
        "--max-model-len 8128")


def test_serve_flags_become_the_deployment(bench):
    assert bench.serve_settings(BASE) == {"gpu_memory_utilization": 0.95, "max_model_len": 8128}
    assert bench.serve_settings(BASE + " --quantization fp8 --kv-cache-dtype fp8") == {
        "gpu_memory_utilization": 0.95, "max_model_len": 8128, "quantization": "fp8", "kv_cache_dtype": "fp8"}
    assert bench.serve_settings(BASE + " --no-enable-prefix-caching")["enable_prefix_caching"] is False
    assert bench.serve_settings(BASE + " --no-enable-chunked-prefill")["enable_chunked_prefill"] is False
    assert bench.serve_settings(BASE + " --enforce-eager") is None          # not modelled: left out
    with pytest.raises(SystemExit, match="unknown flag --foo"):
        bench.serve_settings(BASE + " --foo 1")


def test_every_run_is_simulated_under_its_own_load(bench):
    runs, left_out = bench.load_runs()
    assert len(runs) + left_out == 116 and left_out == 21
    for run in runs:
        deployment = run.deployment()
        assert deployment.client_turnaround == SERVED_TURNAROUND and deployment.gpu_memory_utilization == 0.95
        assert run.requests == 1024 and run.rate > 0 and 4 <= run.clients <= 256


@pytest.mark.parametrize("flags, logged", [("", 418_720), (" --kv-cache-dtype fp8", 837_440),
                                           (" --quantization fp8", 465_824), (" --max-num-seqs 64", 429_136),
                                           (" --max-num-batched-tokens 16384", 418_272),
                                           (" --no-enable-chunked-prefill", 418_720)])
def test_the_memory_plan_holds_the_kv_cache_vllm_018_logged(bench, flags, logged):
    """Each server's "GPU KV cache size" (vLLM 0.18.0, H100 80GB HBM3), against the plan: within 0.2%."""
    plan = plan_deployment(Deployment(model="Qwen/Qwen3-8B", gpu="h100-sxm", **bench.serve_settings(BASE + flags)))
    assert plan.num_gpu_blocks * plan.block_size == pytest.approx(logged, rel=0.002)
