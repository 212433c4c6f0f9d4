"""bench/bench_silicon_h100.py simulates each measured H100 run as it was made: InferenceMAX's runs with its
published recipe (FP8 KV cache, no prefix caching, --max-num-seqs CONC, lengths uniform on [int(0.8 L), L],
10 x CONC prompts), the others with vLLM's API-server defaults and fixed lengths."""

from pathlib import Path

import pytest

from planner.api import run_spec

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_silicon_h100.py"


def trace(bench, row, requests):
    spec = run_spec(bench.deployment(row), workload="random", params=bench.workload_params(row),
                    requests=requests, concurrency=row.concurrency)
    return spec.load.trace()


def test_inferencemax_runs_draw_their_clients_lengths(bench):
    runs = [r for r in bench.rows() if bench.recipe(r) is bench.INFERENCEMAX_LLAMA70B]
    assert len(runs) == 45 and {r.model for r in runs} == {"meta-llama/Llama-3.1-70B"}
    for isl, osl in ((1024, 1024), (1024, 8192), (8192, 1024)):
        row = next(r for r in runs if (r.isl, r.osl) == (isl, osl))
        requests = list(trace(bench, row, 2000))
        for lengths, full in (([q.prompt_len for q in requests], isl), ([q.output_len for q in requests], osl)):
            assert int(full * 0.8) <= min(lengths) < int(full * 0.81) and full * 0.99 < max(lengths) <= full
            assert abs(sum(lengths) / len(lengths) - 0.9 * full) < 0.01 * full
        params = bench.workload_params(row)     # the generator's bounds, exactly the client's
        for length, full in ((params["input_len"], isl), (params["output_len"], osl)):
            r = params["range_ratio"]
            assert (int(length * (1 - r)), int(length * (1 + r))) == (int(full * 0.8), full)
        d = bench.deployment(row)
        assert (d.kv_cache_dtype, d.enable_prefix_caching, d.max_num_seqs) == ("fp8", False, row.concurrency)
        assert d.max_model_len == 10240 and d.max_num_batched_tokens == 8192
        assert d.async_scheduling and bench.cost_model(row).async_scheduling
        assert d.client_turnaround > 0        # served: InferenceMAX's client is vLLM's benchmark over HTTP


def test_other_runs_keep_fixed_lengths_and_vllms_defaults(bench):
    row = next(r for r in bench.rows() if r.weights == "bf16")
    assert bench.recipe(row) is bench.VLLM_DEFAULTS
    requests = list(trace(bench, row, 64))
    assert {q.prompt_len for q in requests} == {row.isl} and {q.output_len for q in requests} == {row.osl}
    d = bench.deployment(row)
    assert (d.enable_prefix_caching, d.max_num_seqs, d.max_model_len) == (True, 1024, row.isl + row.osl)
    assert not bench.cost_model(row).async_scheduling
    assert d.client_turnaround == 0.0         # no client recorded: the planner's default


def test_a_served_runs_schedule_priced_again_reproduces_its_simulation(bench):
    # Re-pricing keeps the simulated schedule: with served clients each request is sent a turnaround after a
    # step's end, and the engine may idle meanwhile; priced by the same model, the means come back exactly.
    row = next(r for r in bench.rows() if bench.recipe(r) is bench.INFERENCEMAX_LLAMA70B and r.concurrency == 4)
    row = bench.replace(row, osl=100, isl=1000, concurrency=1)   # short; one client: the engine idles between requests
    rec = bench.record(row)
    assert rec.schedule.turnaround > 0 and rec.schedule.idle.max() > 0
    again = bench.reprice(rec, bench.cost_model(row))
    assert again == pytest.approx(rec.simulated, rel=1e-9)
    with pytest.raises(SystemExit, match="within the clients' turnaround"):
        rec.schedule.reprice([rec.schedule.turnaround / 2] * len(rec.shapes))


def test_aiconfigurators_recipe_sizes_the_server_by_its_clients(bench, monkeypatch):
    # --aiconfigurator-recipe: NVIDIA's vLLM 0.12 runs as aiconfigurator's generator deploys vLLM (max_num_seqs the
    # batch size, a token budget of batch size + ISL + 1500, max_model_len ISL + OSL + 1500), fixed lengths, 20 x C
    row = next(r for r in bench.rows() if r.weights == "bf16" and (r.isl, r.concurrency) == (4096, 32))
    monkeypatch.setattr(bench, "nvidia_recipe", bench.AICONFIGURATOR_AGG)
    assert bench.recipe(row) is bench.AICONFIGURATOR_AGG
    d = bench.deployment(row)
    assert (d.max_num_seqs, d.max_num_batched_tokens, d.max_model_len) == (32, 32 + 4096 + 1500, 4096 + row.osl + 1500)
    assert not d.enable_prefix_caching and not d.async_scheduling
    assert bench.AICONFIGURATOR_AGG.requests(row.concurrency) == 20 * 32
    assert {q.prompt_len for q in trace(bench, row, 64)} == {4096}
    other = next(r for r in bench.rows() if r.weights == "fp8" and r.model == "Qwen/Qwen3-32B")
    assert bench.recipe(other) is bench.VLLM_DEFAULTS     # the Dynamo runs are not vLLM 0.12.0's own
