"""--async-scheduling, vLLM's flag, is one deployment setting: every command's simulation prices it (the
measured model hides its fitted host time behind the GPU's), the models that cannot separate vLLM's host
time price the same steps, None is vLLM's own default (on for vllm-v1 on a GPU), and the live engine,
which schedules synchronously, refuses it. The simulator's measured model also takes the deployment's
CUDA-graph capture sizes (max_num_seqs). And the simulator schedules as vLLM's engine core then does:
one step ahead, so a request that arrives during step N joins step N+2."""

import pytest
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from engine.deployment import Deployment
from engine.llm_engine import check_runnable
from planner.api import simulate
from planner.cli.app import app
from planner.cost.linear import LinearCostModel
from planner.cost.shape import StepShape
from planner.deploy.plan import plan_deployment
from planner.runs.pipeline import build_cost_model
from planner.sim import simulate as simulate_trace
from planner.sim.fleet import simulate_fleet
from planner.sim.speculative import SpecRuntime, draft_cost_model
from sim_helpers import sim_plan
from workloads import Trace, TraceRequest, make_trace

H100 = dict(model="llama-3.1-8b", gpu="h100-sxm", max_model_len=4096)


def test_async_scheduling_hides_the_host_time_and_is_recorded():
    runs = {on: simulate(Deployment(**H100, async_scheduling=on), workload="random", requests=48, concurrency=16,
                         params={"input_len": 512, "output_len": 64})
            for on in (False, True)}
    sync, overlapped = (runs[on].metrics for on in (False, True))
    assert overlapped.tpot_mean < sync.tpot_mean * 0.97       # ~1 ms of host time per step, hidden
    assert overlapped.ttft_mean < sync.ttft_mean
    assert [runs[on].document()["deployment"]["async_scheduling"] for on in (False, True)] == [False, True]
    assert "--async-scheduling" in runs[True].spec.command()


def test_the_measured_model_takes_the_deployments_graph_sizes_and_scheduling():
    model = build_cost_model(plan_deployment(Deployment(**H100, max_num_seqs=8, async_scheduling=True)))
    assert model.async_scheduling and model.graphs.largest == 16          # vLLM: min(2 x max_num_seqs, 512)
    assert build_cost_model(plan_deployment(Deployment(**H100))).graphs.largest == 512


def test_by_default_it_is_vllms_own_choice():
    """None resolves as vLLM 0.19 does: on for vllm-v1 on a GPU, off where vLLM turns it off (n-gram or
    draft-model speculation), under the paper's policy, and on the CPU (this engine's twin); a value given wins."""
    def resolved(**knobs) -> bool | None:
        return plan_deployment(Deployment(**{**H100, **knobs})).deployment.async_scheduling

    assert Deployment().async_scheduling is None
    assert resolved() is True and resolved(speculative="eagle:3") is True and resolved(speculative="mtp:1") is True
    assert resolved(speculative="ngram:2", acceptance="0.5,0.5") is False and resolved(policy="paper") is False
    assert resolved(async_scheduling=False) is False
    assert resolved(model="opt-125m", gpu="cpu", max_model_len=2048) is False
    result = CliRunner().invoke(app, ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--requests", "4",
                                      "--no-async-scheduling", "--json"])
    assert result.exit_code == 0, result.output
    assert '"async_scheduling": false' in result.output


def test_models_without_vllms_host_time_price_the_same_steps():
    """The roofline has no host time to hide: with async scheduling only the schedule changes."""
    shape = StepShape(1, 512, 512 * 513 // 2, 8, 8 * 1024)
    sync, overlapped = (build_cost_model(plan_deployment(Deployment(**H100, async_scheduling=on)),
                                         cost_model="roofline") for on in (False, True))
    assert overlapped.step_time(shape) == sync.step_time(shape)
    assert simulate(Deployment(**H100, async_scheduling=True), workload="random", requests=8, concurrency=4,
                    cost_model="roofline", params={"input_len": 64, "output_len": 8}).metrics.num_completed == 8


def test_a_draft_pass_is_gpu_time_with_async_scheduling_too():
    """EAGLE's head runs on the GPU after the target's forward: its pass adds its GPU time to the step
    whether the host is hidden or not (not the max of a step of its own, which is the host's time)."""
    shape = StepShape(decode_seqs=4, decode_context=4 * 512)
    passes = []
    for on in (False, True):
        draft = draft_cost_model(plan_deployment(Deployment(**H100, speculative="eagle:3", async_scheduling=on)))
        passes.append(SpecRuntime(None, draft, draft)._draft_pass(shape, 4))
    assert passes[0] == passes[1]
    assert 0 < passes[1] < draft.host(4)          # a small head at 4 sequences: less than the host's step


def test_the_live_engine_refuses_it(tmp_path):
    with pytest.raises(ValueError, match="async scheduling: this engine schedules each step"):
        check_runnable(Deployment(model="opt-125m", gpu="cpu", async_scheduling=True), str(tmp_path))


# -- the schedule: vLLM schedules step N+1 as step N starts, so a request that arrives during step N joins N+2 --

COST = LinearCostModel(0.01, 1e-4)      # every step at least 10 ms


def trace60():
    return make_trace("random", num_requests=60, rate=1.0, seed=0, input_len=200, output_len=30, range_ratio=0.5)


def async_run(async_scheduling: bool, turnaround: float = 0.002, clients: int = 6, **options):
    plan = sim_plan("opt-125m", "a100-40g", policy="vllm-v1", client_turnaround=turnaround,
                    async_scheduling=async_scheduling)
    return simulate_trace(trace60(), plan, COST, concurrency=clients, **options)


def running_at(steps, t: float) -> int:
    """The index of the step running at `t` (its start before t, its end after)."""
    return next(i for i, s in enumerate(steps) if s.start < t < s.end)


@pytest.mark.parametrize("async_scheduling, later", [(False, 1), (True, 2)])
def test_a_request_arriving_during_a_step_joins_the_next_one_or_with_async_scheduling_the_one_after(
        async_scheduling, later):
    result = async_run(async_scheduling)
    steps = result.steps
    for r in result.requests[6:]:          # served clients' later requests, each sent while a step runs
        running = running_at(steps, r.arrival)
        # a 200-token prompt is prefilled in one step, whose end is the request's first token
        assert r.first_token == steps[running + later].end


def test_async_scheduling_adds_a_step_to_a_served_clients_ttft_and_fast_forward_keeps_the_schedule():
    sync, overlapped = async_run(False), async_run(True)
    assert overlapped.metrics.ttft_mean > sync.metrics.ttft_mean + 0.008      # one ~10 ms step more
    assert overlapped.metrics.num_completed == 60
    slow = async_run(True, fast_forward=False)
    assert overlapped.fast_forwarded_steps > 0
    assert overlapped.requests == slow.requests and overlapped.steps == slow.steps


def test_a_request_reaching_an_idle_engine_is_scheduled_at_once_with_async_scheduling():
    result = async_run(True, turnaround=0.5, clients=1)     # each request alone: nothing is scheduled ahead
    for r in result.requests:
        assert any(s.start == r.arrival for s in result.steps)
        assert r.first_token == next(s.end for s in result.steps if s.start == r.arrival)


def test_a_fleets_replicas_schedule_ahead_too():
    plan = sim_plan("opt-125m", "a100-40g", policy="vllm-v1", client_turnaround=0.002, async_scheduling=True)
    fast, slow = (simulate_fleet(trace60(), plan, COST, replicas=2, router="least-requests", concurrency=6,
                                 fast_forward=ff) for ff in (True, False))
    assert fast.requests == slow.requests and fast.steps == slow.steps
    one = simulate_fleet(trace60(), plan, COST, replicas=1, concurrency=6)
    assert one.requests == async_run(True).requests       # one replica is the lone deployment


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.tuples(st.integers(1, 600), st.integers(1, 200), st.floats(0, 0.05)), min_size=1,
                        max_size=25),
       policy=st.sampled_from(["vllm-v1", "paper"]))
def test_every_request_completes_and_fast_forward_matches_step_by_step_under_async_scheduling(lengths, policy):
    t, requests = 0.0, []
    for i, (prompt, output, gap) in enumerate(lengths):
        t += gap
        requests.append(TraceRequest(request_id=f"r{i}", arrival_time=t, prompt_len=prompt, output_len=output))
    trace = Trace(requests, name="drawn")
    plan = sim_plan("opt-125m", "a100-40g", policy=policy, async_scheduling=True, max_model_len=2048)
    fast, slow = (simulate_trace(trace, plan, COST, fast_forward=ff) for ff in (True, False))
    assert fast.metrics.num_completed == len(trace)
    assert fast.requests == slow.requests and fast.steps == slow.steps
    for r in fast.requests:      # nobody joins a step that began before it arrived
        assert r.first_token > r.arrival
