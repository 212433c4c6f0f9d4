"""Pipeline parallelism (--pp): vLLM's stage split, the memory a stage holds, the batch queue's timing
and its scheduling (a request's tokens all in flight are not scheduled again), and what is refused."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from engine.deployment import Deployment
from planner import simulate
from planner.cli.app import app
from planner.catalog import resolve_gpu, resolve_model
from planner.deploy.parallel import stage_layers
from planner.deploy.plan import plan_deployment
from planner.errors import PlannerError
from planner.sim.pipeline import Stages

LINEAR = "linear:0.01,0"          # every step 10 ms, whatever it holds


@pytest.mark.parametrize("layers, pp, split", [
    (80, 2, [40, 40]), (61, 2, [31, 30]), (80, 3, [27, 27, 26]), (126, 4, [31, 32, 32, 31]), (32, 1, [32]),
])
def test_stages_split_the_layers_as_vllm_does(layers, pp, split):
    # vllm/distributed/utils.py get_pp_indices: the remainder goes to the stages before the last
    assert stage_layers(layers, pp) == split


def test_a_stage_holds_its_share_of_the_weights_and_more_kv():
    whole = plan_deployment(Deployment(model="llama-3.1-70b", gpu="h100-sxm", tp=4)).memory
    half = plan_deployment(Deployment(model="llama-3.1-70b", gpu="h100-sxm", tp=4, pp=2)).memory
    assert half.weight_bytes_per_gpu == pytest.approx(whole.weight_bytes_per_gpu / 2, rel=1e-6)
    assert half.block_bytes_per_gpu == whole.block_bytes_per_gpu // 2
    # half the weights leave more room, and each block holds half the layers
    assert half.num_gpu_blocks > 2 * whole.num_gpu_blocks


def one_request(pp: int, output_len: int = 20, **knobs):
    dep = Deployment(model="llama-3.1-8b", gpu="h100-sxm", pp=pp, max_model_len=4096, **knobs)
    return simulate(dep, workload="fixed", requests=1, params={"prompt_len": 64, "output_len": output_len},
                    cost_model=LINEAR)


def test_one_request_waits_out_the_whole_pipeline_each_token():
    plain, piped = one_request(1), one_request(2)
    stages = Stages.of(resolve_model("llama-3.1-8b"), resolve_gpu("h100-sxm"), 1, 2)
    assert stages.share == 0.5                         # 32 layers, 16 a stage
    send = stages.send_latency + stages.send_per_token  # one decode token to the next stage
    assert plain.metrics.tpot_mean == pytest.approx(0.01)
    assert piped.metrics.tpot_mean == pytest.approx(0.01 + send)   # two half-steps and a send per token
    assert piped.metrics.ttft_mean == pytest.approx(0.01 + stages.send_latency + 64 * stages.send_per_token)


def two_requests(budget: int):
    dep = Deployment(model="llama-3.1-8b", gpu="h100-sxm", pp=2, max_model_len=4096, max_num_batched_tokens=budget)
    return simulate(dep, workload="fixed", requests=2, rate=float("inf"),        # both at t = 0
                    params={"prompt_len": 64, "output_len": 30}, cost_model=LINEAR)


def test_requests_scheduled_apart_take_turns_through_the_pipeline():
    together = two_requests(budget=8192)     # both prompts in the first batch: one group, one batch in flight
    apart = two_requests(budget=64)          # one prompt per batch: two groups, two batches in flight
    assert {s.batch_size for s in together.sim.steps} == {2}
    assert {s.batch_size for s in apart.sim.steps} == {1}
    # each group's batch overlaps the other's: the pair ends half a step after one group would
    assert apart.metrics.duration < together.metrics.duration + 0.006
    assert len(apart.sim.steps) == 2 * len(together.sim.steps)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pp=st.integers(2, 4), seed=st.integers(0, 10_000), blocks=st.sampled_from([40, 400]))
def test_every_request_gets_its_tokens_with_batches_in_flight(pp, seed, blocks):
    # 40 blocks of 16 force preemptions of requests whose tokens are in flight
    dep = Deployment(model="llama-3.1-8b", gpu="h100-sxm", max_model_len=512, max_num_batched_tokens=256,
                     num_gpu_blocks=blocks)
    load = dict(workload="uniform", requests=24, rate=50.0, seed=seed,
                params={"prompt_min": 8, "prompt_max": 200, "output_min": 1, "output_max": 60})
    plain = simulate(dep, **load)
    piped = simulate(dep.replace(pp=pp), **load)
    want = {r.request_id: r.output_len for r in plain.sim.requests}
    assert {r.request_id: r.output_len for r in piped.sim.requests} == want
    assert all(r.finish is not None and not r.rejected for r in piped.sim.requests)
    assert all(len(r.token_times) == r.output_len for r in piped.sim.requests)


def test_preempted_requests_in_flight_recompute():
    dep = Deployment(model="llama-3.1-8b", gpu="h100-sxm", pp=2, max_model_len=512, max_num_batched_tokens=256,
                     num_gpu_blocks=40)
    run = simulate(dep, workload="uniform", requests=40, rate=200.0,
                   params={"prompt_min": 100, "prompt_max": 200, "output_min": 40, "output_max": 60})
    assert run.metrics.preemptions["recompute"] > 0
    assert all(r.output_len >= 40 for r in run.sim.requests)


@pytest.mark.parametrize("knobs, message", [
    (dict(policy="paper"), "no pipeline parallelism"),
    (dict(model="qwen3-30b-a3b", dp=2), "not modelled with --dp"),
    (dict(model="gpt-oss-20b"), "layers of different kinds"),
    (dict(pp=64), "leaves a stage without layers"),
])
def test_what_the_planner_does_not_model_is_refused(knobs, message):
    dep = Deployment(**{"model": "llama-3.1-8b", "gpu": "h100-sxm", "pp": 2, "max_model_len": 4096, **knobs})
    with pytest.raises(PlannerError, match=message):
        plan_deployment(dep)


def test_cli_refuses_pp_with_pd_in_one_line():
    result = CliRunner().invoke(app, ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--pp", "2",
                                      "--requests", "4", "--pd", "1:1"])
    assert result.exit_code == 2 and "is not modelled" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("router", ["round-robin", "least-kv", "prefix-aware"])
def test_a_fleet_of_pipelined_replicas_routes_and_ends_every_request(router):
    from planner.api import run_spec
    dep = Deployment(model="llama-3.1-8b", gpu="h100-sxm", pp=2, max_model_len=2048)
    spec = run_spec(dep, workload="prefix", rate=20.0, requests=60).with_fleet(replicas=2, router=router)
    doc = simulate(spec).document()
    assert doc["num_completed"] == 60 and doc["fleet"]["replicas"] == 2
    assert sum(r["num_completed"] for r in doc["fleet"]["per_replica"]) == 60
    if router != "prefix-aware":         # (which may keep one prompt prefix on one replica)
        assert all(r["num_requests"] > 0 for r in doc["fleet"]["per_replica"])


def test_search_prices_each_configuration_at_tp_x_pp_gpus():
    from planner import api
    dep = Deployment(model="llama-3.1-8b", gpu="h100-sxm", pp=2, max_model_len=2048)
    result = api.search(dep, slos="tpot_p99=0.05", gpus=["h100-sxm"], tps=[1, 2], rate=2.0, requests=40,
                        prices={"h100-sxm": 2.0}, max_rate=4.0)
    assert {(r["tp"], r["pp"], r["cost_per_hour"]) for r in result.configs} == {(1, 2, 4.0), (2, 2, 8.0)}
    assert result.document()["best"]["pp"] == 2


def test_a_pipelined_run_documents_its_fields():
    from test_result_schema import undocumented
    doc = one_request(2).document()
    assert doc["params"]["pp"] == 2 and doc["memory_plan"]["pp"] == 2 and not undocumented(doc)
    assert any("pipeline parallelism" in note for note in doc["not_modelled"])


def test_async_scheduling_runs_the_same_batch_queue():
    # vLLM runs async scheduling with PP on the condition that no request has two tokens in flight
    dep = Deployment(model="llama-3.1-8b", gpu="h100-sxm", pp=2, max_model_len=2048)
    assert plan_deployment(dep).deployment.async_scheduling is True          # vLLM's default, as without PP
    load = dict(workload="sharegpt", rate=20.0, requests=80)
    on, off = simulate(dep, **load), simulate(dep.replace(async_scheduling=False), **load)
    assert [r.token_times for r in on.sim.requests] == [r.token_times for r in off.sim.requests]


def test_the_engine_refuses_pp():
    from engine.llm_engine import check_runnable
    with pytest.raises(ValueError, match="pipeline parallel size 2"):
        check_runnable(Deployment(pp=2), "unused")
