"""planner validate: the live engine and the simulator make the same decisions on the same trace."""
from __future__ import annotations

import gc
import json
import math

import pytest

from engine.deployment import Deployment

from planner.catalog import ModelSpec
from planner.validation.run import load_cost_model, validate
from planner.validation.spec import ValidationSpec
from planner.validation.report import write_report
from sim_helpers import ConstantCost
from tiny_models import save_tiny_model

# It reads the wall clock (a live engine, a server, a time limit): scripts/test.sh runs it alone.
pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("llama"))


@pytest.mark.parametrize("mode, policy", [("recompute", "paper"), ("swap", "paper"), ("recompute", "vllm-v1")])
def test_simulator_predicts_the_live_preemptions_under_memory_pressure(llama_dir, tmp_path, mode, policy):
    # All requests at t=0: scheduling no longer depends on step times, so the
    # simulator must reproduce the engine's decisions exactly.
    # max_model_len within the 12-block cache: the engine refuses a longer one, as vLLM does (40 + 30 tokens fit).
    deployment = Deployment(model=llama_dir, gpu="cpu", block_size=8, num_gpu_blocks=12, preemption_mode=mode,
                            max_num_seqs=8, max_model_len=80, policy=policy)
    spec = ValidationSpec(deployment, workload="alpaca", rate=math.inf, requests=10, length_scale=1.0,
                          max_prompt_len=40, max_output_len=30, attribution=True)
    v = validate(spec, cost_model=ConstantCost())
    live, sim = v.live.metrics, v.simulated
    assert live["num_completed"] == sim["num_completed"] == 10
    assert live["preemptions"][mode] > 0
    assert live["preemptions"] == sim["preemptions"]
    assert [s.batch_size for s in v.live.steps] == [s.batch_size for s in v.sim_steps]
    assert [s.kv_blocks_used for s in v.live.steps] == [s.kv_blocks_used for s in v.sim_steps]
    assert len(v.step_errors) == len(v.live.steps)

    paths, doc = write_report(v, tmp_path / "report")
    assert json.loads((tmp_path / "report" / "comparison.json").read_text()) == doc
    assert doc["comparison"]["preemptions"]["relative_error"] == 0
    assert doc["comparison"]["mean_batch_size"]["relative_error"] == 0
    _assert_attribution_adds_up(v, doc)
    text = paths["markdown"].read_text()
    assert "## Where the error comes from" in text
    assert "| request_throughput |" in text and "timeline.png" in text
    assert (tmp_path / "report" / "latency_cdf.png").stat().st_size > 0


def test_the_simulator_caps_prompt_chunks_as_the_live_engine_does(llama_dir):
    # vLLM's --long-prefill-token-threshold: every request at t=0, so the simulator must take the live
    # engine's steps one for one, each prompt going 8 tokens at a time beside the others
    deployment = Deployment(model=llama_dir, gpu="cpu", block_size=8, max_num_seqs=8, max_model_len=80,
                            max_num_batched_tokens=32, long_prefill_token_threshold=8)
    spec = ValidationSpec(deployment, workload="alpaca", rate=math.inf, requests=8, length_scale=1.0,
                          max_prompt_len=40, max_output_len=6, seeds=0)
    v = validate(spec, cost_model=ConstantCost())
    live = [(s.batch_size, s.prefill_tokens, s.decode_tokens) for s in v.live.steps]
    assert live == [(s.batch_size, s.prefill_tokens, s.decode_tokens) for s in v.sim_steps]
    assert max(prefill for _, prefill, _ in live) == 32 and v.live.metrics["num_completed"] == 8


def test_the_simulator_runs_prompts_whole_without_chunked_prefill_as_the_live_engine_does(llama_dir):
    # vLLM's --no-enable-chunked-prefill with an 80-token budget: every request at t=0, so the simulator must
    # take the live engine's steps one for one, a prompt more than the budget left waiting for a later step
    deployment = Deployment(model=llama_dir, gpu="cpu", block_size=8, max_num_seqs=8, max_model_len=80,
                            max_num_batched_tokens=80, enable_chunked_prefill=False)
    spec = ValidationSpec(deployment, workload="alpaca", rate=math.inf, requests=8, length_scale=1.0,
                          max_prompt_len=40, max_output_len=6, seeds=0)
    v = validate(spec, cost_model=ConstantCost())
    live = [(s.batch_size, s.prefill_tokens, s.decode_tokens) for s in v.live.steps]
    assert live == [(s.batch_size, s.prefill_tokens, s.decode_tokens) for s in v.sim_steps]
    assert v.live.metrics["num_completed"] == 8 and max(prefill for _, prefill, _ in live) <= 80


def test_the_simulator_schedules_by_priority_as_the_live_engine_does(llama_dir):
    # vLLM's --scheduling-policy priority, half the requests at priority 1, in a 12-block cache: every request
    # at t=0, so the simulator must take the live engine's steps and preemptions one for one
    deployment = Deployment(model=llama_dir, gpu="cpu", block_size=8, num_gpu_blocks=12, max_num_seqs=8,
                            max_model_len=80, scheduling_policy="priority")
    spec = ValidationSpec(deployment, workload="alpaca", params=(("low_priority_share", 0.5),), rate=math.inf,
                          requests=10, length_scale=1.0, max_prompt_len=40, max_output_len=30, seeds=0)
    v = validate(spec, cost_model=ConstantCost())
    live = [(s.batch_size, s.prefill_tokens, s.decode_tokens, s.preempted) for s in v.live.steps]
    assert live == [(s.batch_size, s.prefill_tokens, s.decode_tokens, s.preempted) for s in v.sim_steps]
    assert v.live.metrics["preemptions"] == v.simulated["preemptions"] and v.live.metrics["num_completed"] == 10
    assert v.live.metrics["preemptions"]["recompute"] > 0


def test_the_simulator_takes_the_live_engines_steps_with_lora_adapters_waiting_their_turn(llama_dir):
    # 3 adapters over the requests in turn, 1 a step (vLLM's --max-loras 1), every request at t=0: the live
    # engine (random adapters loaded for the run) and the simulator pass over the same requests, step for step
    deployment = Deployment(model=llama_dir, gpu="cpu", block_size=8, max_num_seqs=8, max_model_len=80,
                            enable_lora=True, max_loras=1, max_lora_rank=8)
    spec = ValidationSpec(deployment, workload="alpaca", params=(("loras", 3), ("lora_assignment", "round-robin")),
                          rate=math.inf, requests=9, length_scale=1.0, max_prompt_len=40, max_output_len=6,
                          seeds=0)
    v = validate(spec, cost_model=ConstantCost())
    live = [(s.batch_size, s.prefill_tokens, s.decode_tokens) for s in v.live.steps]
    assert live == [(s.batch_size, s.prefill_tokens, s.decode_tokens) for s in v.sim_steps]
    assert v.live.metrics["num_completed"] == 9
    assert max(s.batch_size for s in v.live.steps) == 3      # one adapter's 3 requests at a time


def test_missing_profile_is_a_clear_error(llama_dir, tmp_path):
    from planner.errors import PlannerError
    spec = ValidationSpec(Deployment(model=llama_dir, gpu="cpu"), requests=2, profile=str(tmp_path / "none.json"))
    with pytest.raises(PlannerError, match="no profile at"):
        validate(spec)


def test_cli_calibrates_then_validates_and_prints_one_json_document(llama_dir, tmp_path):
    from typer.testing import CliRunner

    from planner.cli.app import app
    result = CliRunner().invoke(app, ["validate", "--model", llama_dir, "--workload", "alpaca", "--requests", "6",
                                      "--rate", "50", "--length-scale", "0.5", "--reprofile",
                                      "--out", str(tmp_path / "run"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["cost_model"].startswith("calibrated(") and (tmp_path / "run" / "profile.json").exists()
    assert doc["num_completed"] == {"measured": 6, "simulated": 6}
    assert (tmp_path / "run" / "report.md").exists() and (tmp_path / "run" / "report.html").exists()
    assert doc["verdict"]["lines"] and "within_targets" in doc["verdict"]
    assert json.loads((tmp_path / "run" / "comparison.json").read_text())["verdict"] == doc["verdict"]


def test_cli_bad_input_is_one_line_and_exit_2(llama_dir, tmp_path):
    from typer.testing import CliRunner

    from planner.cli.app import app
    result = CliRunner().invoke(app, ["validate", "--model", llama_dir, "--gpu", "a100", "--requests", "2",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert "no CUDA device" in result.stderr


@pytest.mark.parametrize("args, message", [
    (["--length-scale", "0"], "--length-scale must be a positive number"),
    (["--max-output-len", "0"], "--max-output-len must be at least 1"),
    (["--requests", "0"], "--requests must be at least 1"),
    (["--replicas", "99999999999"], "--replicas 99999999999: a live fleet runs 1 to 64 replicas on this machine"),
    (["--seeds", "1001"], "--seeds must be 0 (no intervals) to 1,000, got 1001"),
])
def test_cli_bad_lengths_are_refused_even_with_quick(args, message, tmp_path):
    from typer.testing import CliRunner

    from planner.cli.app import app
    result = CliRunner().invoke(app, ["validate", "--gpu", "cpu", "--quick", *args, "--out", str(tmp_path)])
    assert result.exit_code == 2 and message in result.stderr


def test_cli_flags_win_over_quick(monkeypatch, tmp_path):
    """`--quick --requests 224` runs 224 requests (--quick gives the values not given, as its help says)."""
    from typer.testing import CliRunner

    from planner.cli import validate as cli
    from planner.cli.app import app
    seen = {}

    def capture(spec, folder, reprofile, err):
        seen["spec"] = spec
        raise cli.PlannerError("stop here")
    monkeypatch.setattr(cli, "_validate_here", capture)
    CliRunner().invoke(app, ["validate", "--gpu", "cpu", "--quick", "--requests", "224", "--out", str(tmp_path)])
    spec = seen["spec"]
    assert (spec.requests, spec.rate, spec.length_scale, spec.max_output_len) == (224, 2.0, 0.08, 64)



def _assert_attribution_adds_up(v, doc):
    """The error split (planner/validation/attribution.py): its three parts add up to the comparison's error."""
    a = v.attribution
    assert a["steps"]["live"] == len(v.live.steps) and a["between_step_time"]["total_s"] >= 0
    for name in ("e2e_mean", "request_throughput"):
        row = a[name]
        parts = ("step_time_model", "scheduling", "between_steps")
        assert sum(row[p]["error"] for p in parts) == pytest.approx(row["total_error"], abs=1e-9)
        assert row["total_error"] == pytest.approx(v.comparison()[name]["relative_error"], abs=1e-9)
        if row["total_error"]:
            assert sum(row[p]["share"] for p in parts) == pytest.approx(1)
    assert doc["error_attribution"]["e2e_mean"]["total_error"] == a["e2e_mean"]["total_error"]


def test_speed_level_from_canaries_scales_the_simulation(llama_dir, tmp_path):
    # A profile taken while the device ran 10x slower than now: the canaries bracketing the live run
    # see it, the simulation prices steps with the profile scaled by that level, and the report
    # keeps the errors without the correction.
    from planner.profile.fit import fit_all
    from planner.profile.schema import save_profile
    from planner.profile.run import ProfileOptions, run_profile
    from planner.validation.report import as_json

    grid = dict(prefill_tokens=[8, 32, 64], prefill_seqs=[1], decode_batch=[1, 4, 8], decode_context=[16, 64],
                host_batch=[1, 8], block_counts=[1, 4], warmup=1)
    profile = run_profile(ProfileOptions(Deployment(model=llama_dir, gpu="cpu"), quick=True, repeats=2, grid_overrides=grid))
    for m in profile.measurements:
        m.median_s *= 10
    profile.fit = fit_all(profile.measurements)       # refitted: a profile's fit prices its own measurements
    path = save_profile(profile, tmp_path / "slow.json")
    cfg = dict(deployment=Deployment(model=llama_dir, gpu="cpu"), workload="alpaca", rate=math.inf, requests=6,
               length_scale=0.5, max_prompt_len=40, max_output_len=16, profile=str(path), attribution=True)
    cost = load_cost_model(ValidationSpec(**cfg), ModelSpec.from_model_dir(llama_dir))
    v = validate(ValidationSpec(**cfg, speed_correction=True), cost_model=cost)
    level = v.speed_level
    assert level.applied and level.before is not None and level.after is not None
    assert level.factor < 0.5                    # loose: a shared CPU's load moves the canaries
    # All requests arrive at once, so scheduling does not depend on step times: every step scales.
    assert v.simulated["step_time_median"] == pytest.approx(v.uncorrected["step_time_median"] * level.factor)
    doc = as_json(v)["speed_level"]
    assert doc["factor"] == level.factor and set(doc["errors_without_correction"]) == {
        "request_throughput", "e2e_mean", "step_time_median"}
    for correction in (None, False):    # the default leaves a canary level out: a few seconds can mislead
        off = validate(ValidationSpec(**cfg, speed_correction=correction), cost_model=cost)
        assert not off.speed_level.applied and off.uncorrected is None and "speed level" not in off.cost_model


def test_a_profile_timed_along_the_run_reports_the_device_speed_and_follows_it_by_default(llama_dir, tmp_path):
    from planner.profile.along import ProfileAlong
    from planner.profile.run import ProfileOptions
    from planner.validation.report import as_json

    grid = dict(prefill_tokens=[8, 32, 64], prefill_seqs=[1], decode_batch=[1, 4, 8], decode_context=[16, 64],
                host_batch=[1, 8], block_counts=[1, 4], warmup=1)
    cfg = dict(deployment=Deployment(model=llama_dir, gpu="cpu"), workload="sharegpt", rate=math.inf, requests=8,
               length_scale=0.5, max_prompt_len=40, max_output_len=64, attribution=True)
    runs = {}
    for correction, applied in ((None, True), (False, False)):     # the default, and --no-speed-correction
        fresh = ProfileAlong(ProfileOptions(Deployment(model=llama_dir, gpu="cpu"), quick=True, repeats=2, grid_overrides=grid),
                             tmp_path / f"{applied}.json", span_s=1e-3, say=lambda *_: None)
        fresh.slice_every_s, fresh.min_slice_points = 0.003, 1     # slices enough in this short run
        start, beside = fresh.before_steps, []
        fresh.before_steps = lambda runner: beside.append(runner.model_path) or start(runner)
        runs[applied] = v = validate(ValidationSpec(**cfg, speed_correction=correction), fresh=fresh)
        assert beside == [llama_dir]        # its points timed on the live engine's own model
        assert v.speed_timeline is fresh.timeline and v.speed_timeline.applied is applied
        assert len(v.speed_timeline.times) >= 2 and v.speed_level is None      # no canary when profiled along
        assert "between the run's steps" in v.speed_timeline.headline()
    on, off = runs[True], runs[False]
    # Applied: the simulation prices each step at its moment's speed, and the report keeps the errors without.
    timeline = on.speed_timeline
    assert on.uncorrected is not None and off.uncorrected is None
    assert on.simulated["simulated_time"] != pytest.approx(on.uncorrected["simulated_time"], rel=1e-9)
    assert as_json(on)["speed_timeline"]["factors"] == timeline.factors
    assert set(as_json(on)["speed_timeline"]["errors_without_correction"]) == {
        "request_throughput", "e2e_mean", "step_time_median"}


def test_a_closed_loop_keeps_n_requests_in_flight_live_and_simulated(llama_dir, tmp_path):
    # N clients, each sending its next request when its previous one ends: step for step the live engine and
    # the simulator hold the same batch, never more than N, and every request completes.
    deployment = Deployment(model=llama_dir, gpu="cpu", block_size=8, max_num_seqs=8, max_model_len=80)
    spec = ValidationSpec(deployment, workload="alpaca", concurrency=3, requests=9, length_scale=1.0,
                          max_prompt_len=40, max_output_len=12)
    v = validate(spec, cost_model=ConstantCost())
    assert v.live.metrics["num_completed"] == v.simulated["num_completed"] == 9
    live_batches = [s.batch_size for s in v.live.steps]
    assert max(live_batches) == 3
    assert live_batches == [s.batch_size for s in v.sim_steps]
    _, doc = write_report(v, tmp_path / "report")
    assert doc["concurrency"] == 3 and doc["rate"] is None
    assert "from 3 closed-loop clients" in (tmp_path / "report" / "report.md").read_text()


def test_served_clients_live_and_simulated_join_the_step_after_the_one_running(llama_dir):
    # With a client turnaround (0.25 ms, below any step of this model: 0.55 ms and up), the live replay sends
    # a client's next request that long after its previous one ended, as an API server's client would: the
    # step already running goes on without it. The live engine and the simulator hold the same batches step
    # for step. The replay's own time between a step's end and its look for due requests (about 20 us) must
    # stay under the turnaround: a garbage collection of pytest's heap there would let the request in a step
    # early (0.1 ms was once too little on a loaded CI machine), so collection waits until the run is over.
    turnaround = 2.5e-4
    deployment = Deployment(model=llama_dir, gpu="cpu", block_size=8, max_num_seqs=8, max_model_len=80,
                            client_turnaround=turnaround)
    spec = ValidationSpec(deployment, workload="alpaca", concurrency=3, requests=9, length_scale=1.0,
                          max_prompt_len=40, max_output_len=12)
    gc.disable()
    try:
        v = validate(spec, cost_model=ConstantCost())
    finally:
        gc.enable()
    assert v.live.metrics["num_completed"] == v.simulated["num_completed"] == 9
    live_batches = [s.batch_size for s in v.live.steps]
    assert live_batches == [s.batch_size for s in v.sim_steps]
    first_drain = next(i for i, s in enumerate(v.live.steps) if s.batch_size < 3)
    assert max(live_batches[first_drain:]) == 3      # a client's replacement came back a step later
    # Each next request is stamped when its client sent it: the turnaround after the last request that
    # ended, not when the engine took it in after the step running then.
    finishes = sorted(q.finish for q in v.live.requests)
    step = sorted(s.duration for s in v.live.steps)[len(v.live.steps) // 2]
    for r in v.live.requests[3:]:
        gap = r.arrival - max(f for f in finishes if f <= r.arrival)
        assert turnaround <= gap < turnaround + step / 2


def most_in_flight(records) -> int:
    """The most requests between their arrival and their finish at any one time (a finish frees its slot
    before an arrival stamped with the same time takes it)."""
    events = sorted([(r.arrival, 1) for r in records] + [(r.finish, -1) for r in records])
    in_flight = most = 0
    for _, change in events:
        in_flight += change
        most = max(most, in_flight)
    return most


def test_a_rate_with_a_limit_in_flight_paces_the_live_clients_as_the_simulated_ones(llama_dir, tmp_path):
    # vLLM bench's --request-rate with --max-concurrency: each request is sent when due or, with two out then,
    # when one of them ends, and stamped with that time, live and simulated alike.
    deployment = Deployment(model=llama_dir, gpu="cpu", block_size=8, max_num_seqs=8, max_model_len=80)
    spec = ValidationSpec(deployment, workload="alpaca", rate=400.0, concurrency=2, requests=12, length_scale=1.0,
                          max_prompt_len=40, max_output_len=12)
    trace = spec.trace()
    assert trace.requests[-1].arrival_time > 0      # a trace with times, not every request due at once
    gc.disable()      # a collection of pytest's heap between a step's end and the next send would widen the gap
    try:
        v = validate(spec, cost_model=ConstantCost())
    finally:
        gc.enable()
    assert v.live.metrics["num_completed"] == v.simulated["num_completed"] == 12
    due = [req.arrival_time for req in trace]
    for records in (v.live.requests, v.sim_requests):
        by_id = {r.request_id: r for r in records}
        sent = [by_id[req.request_id].arrival for req in trace]
        ends = sorted(r.finish for r in records)
        assert most_in_flight(records) == 2
        assert sent[:2] == due[:2]
        for k in range(2, len(trace)):   # when due, or the moment the (k-2)th request to end ended
            assert max(due[k], ends[k - 2]) <= sent[k] <= max(due[k], ends[k - 2]) + 0.005
        assert sum(s > d for s, d in zip(sent, due)) > len(trace) // 2    # most wait for a slot
    _, doc = write_report(v, tmp_path / "report")
    assert doc["concurrency"] == 2 and doc["rate"] == 400.0
    assert "at 400 req/s (Poisson), at most 2 in flight" in (tmp_path / "report" / "report.md").read_text()


def test_a_limit_in_flight_never_reached_sends_each_request_at_its_arrival_time(llama_dir):
    deployment = Deployment(model=llama_dir, gpu="cpu", block_size=8, max_num_seqs=8, max_model_len=80)
    spec = ValidationSpec(deployment, workload="alpaca", rate=20.0, concurrency=6, requests=6, length_scale=1.0,
                          max_prompt_len=40, max_output_len=4, seeds=0)
    v = validate(spec, cost_model=ConstantCost())
    by_id = {r.request_id: r for r in v.live.requests}
    assert [by_id[req.request_id].arrival for req in spec.trace()] == [req.arrival_time for req in spec.trace()]


def test_a_workloads_parameters_shape_the_validated_trace(tmp_path):
    spec = ValidationSpec(workload="random", params=(("input_len", 24), ("output_len", 3)), requests=5,
                          length_scale=1.0)
    assert {(r.prompt_len, r.output_len) for r in spec.trace()} == {(24, 3)}
    from typer.testing import CliRunner

    from planner.cli.app import app
    refused = CliRunner().invoke(app, ["validate", "--measured", str(tmp_path / "run.jsonl"), "--model", "opt-125m",
                                       "--gpu", "cpu", "-p", "input_len=24"])
    assert refused.exit_code == 2 and "--param: not used with --measured" in refused.stderr


@pytest.mark.parametrize("args, message", [
    (["--concurrency", "0"], "--concurrency must be at least 1"),
    (["--concurrency", "4", "--rate", "0"], "--rate must be a positive number"),
])
def test_cli_rejects_a_bad_closed_loop_in_one_line(llama_dir, tmp_path, args, message):
    from typer.testing import CliRunner

    from planner.cli.app import app
    result = CliRunner().invoke(app, ["validate", "--model", llama_dir, "--gpu", "cpu", "--requests", "2",
                                      "--out", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert message in result.stderr


def test_the_simulator_loads_from_the_cpu_tier_where_the_live_engine_does(llama_dir):
    # vLLM's --kv-offloading-size: 3 shared prefixes taken in turn by 2 requests at a time in a 24-block cache,
    # every request at t=0. A prefix's blocks leave the GPU while the others run and come back from the CPU
    # tier: the live engine and the simulator load and store the same blocks, step for step
    deployment = Deployment(model=llama_dir, gpu="cpu", block_size=8, num_gpu_blocks=24, max_num_seqs=2,
                            max_model_len=96, kv_offloading_size=0.01)
    spec = ValidationSpec(deployment, workload="prefix", params=(("num_prefixes", 3),), rate=math.inf,
                          requests=12, length_scale=1.0, max_prompt_len=90, max_output_len=6, seeds=0)
    v = validate(spec, cost_model=ConstantCost())
    live = [(s.batch_size, s.prefill_tokens, s.decode_tokens) for s in v.live.steps]
    assert live == [(s.batch_size, s.prefill_tokens, s.decode_tokens) for s in v.sim_steps]
    offload = v.simulated["kv_offload"]
    assert sum(s.offload_blocks for s in v.live.shapes) == offload["blocks_loaded"] + offload["blocks_stored"]
    assert v.live.kv_offload == {key: offload[key] for key in v.live.kv_offload}
    assert offload["blocks_loaded"] > 0
    assert v.live.metrics["num_completed"] == 12
