"""The verdict and steady state (planner/analysis/verdict.py), guardrails and hints, CLI consistency."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from engine.core.metrics import RequestRecord
from planner.deploy import checks as guardrails
from planner.cost.block_size import decode_attention_factor, factor_source
from planner.catalog import resolve_gpu, resolve_model
from planner.cli.app import _boolean_flag_error, app
from planner.cost.roofline import RooflineCostModel
from planner.cost.shape import StepShape
from planner.errors import PlannerError
from workloads import Trace, TraceRequest
from engine.deployment import Deployment
from planner.api import run_spec
from planner.deploy.plan import plan_deployment
from planner.runs.pipeline import run_document
from planner.analysis.verdict import Window, queue_trend, steady_window

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def _records(arrival_rate: float, service_rate: float, n: int = 400) -> list[RequestRecord]:
    """A single-server FIFO queue with fixed arrival and service intervals."""
    records, free_at = [], 0.0
    for i in range(n):
        arrival = i / arrival_rate
        start = max(arrival, free_at)
        free_at = start + 1 / service_rate
        records.append(RequestRecord(str(i), arrival, 10, 10, first_scheduled=start, first_token=start,
                                     finish=free_at, token_times=[start, free_at]))
    return records


def test_queue_growth_is_a_real_test():
    growing = _records(arrival_rate=2.0, service_rate=1.0)
    stable = _records(arrival_rate=1.0, service_rate=2.0)
    for records, expect in ((growing, True), (stable, False)):
        window = steady_window(records)
        trend = queue_trend(records, window)
        assert trend["growing"] is expect
    # Overload at 2x: the queue grows at (arrival - service) = 1 request/s.
    trend = queue_trend(growing, steady_window(growing))
    assert trend["slope"] == pytest.approx(1.0, rel=0.05)


def test_steady_window_excludes_warmup_and_drain():
    records = _records(arrival_rate=1.0, service_rate=2.0, n=100)
    window = steady_window(records)
    assert window == Window(records[10].arrival, records[90].arrival)     # 10% and 90% of the arrivals
    assert steady_window(records[:5]) is None                      # too few requests
    same_time = [RequestRecord(str(i), 0.0, 1, 1) for i in range(50)]
    assert steady_window(same_time) is None                        # all at once: no window


def test_overloaded_run_is_called_overloaded_and_memory_bound():
    doc = run_document(run_spec(workload="sharegpt", rate=12.0, requests=300))
    v = doc["verdict"]
    assert v["overloaded"] and v["bound"] == "memory"
    assert v["requested_rate"] == 12.0 and v["served_rate"] < 0.7 * v["offered_rate"]
    assert v["kv_full_share"] > 0.5
    assert any("OVERLOADED" in line for line in v["lines"])
    assert "--rate" in v["next_commands"][0]["command"]
    # Steady-state figures sit beside the whole-run ones, with the window stated.
    steady = doc["steady_state"]
    assert steady["window"]["start"] > 0 and "90% of the requests had arrived" in steady["window"]["drain"]
    assert steady["mean_batch_size"] > doc["mean_batch_size"]       # the drain's small batches are left out


def test_light_load_keeps_up_and_is_arrival_bound():
    doc = run_document(run_spec(workload="sharegpt", rate=0.5, requests=80))
    v = doc["verdict"]
    assert not v["overloaded"] and v["bound"] == "arrival rate"
    assert v["served_rate_steady"] == pytest.approx(v["offered_rate"], rel=0.35)
    assert "planner simulate" in v["next_commands"][0]["command"]
    assert doc["not_modelled"] and doc["command"].startswith("planner simulate")


def test_too_few_requests_for_a_steady_window_are_told_to_give_more(tmp_path):
    # A rate was given, so asking for one again (as for requests all at once) would rerun the same thing.
    doc = run_document(run_spec(workload="sharegpt", rate=2.0, requests=5))
    v = doc["verdict"]
    assert v["bound"] == "unknown" and "too few requests" in v["bound_reason"]
    assert [c["command"] for c in v["next_commands"]] == [doc["command"].replace("--requests 5", "--requests 1000")]
    at_once = run_document(run_spec(workload="sharegpt", requests=50, rate=float("inf")))["verdict"]
    assert at_once["bound"] == "unknown" and at_once["next_commands"][0]["why"] == "give a rate so arrivals spread out"
    # A trace file holds only its own requests: more cannot be asked of it.
    Trace([TraceRequest(request_id=str(i), arrival_time=i * 0.5, prompt_len=20, output_len=8) for i in range(5)]
          ).save(tmp_path / "five.jsonl")
    short_file = run_document(run_spec(workload=str(tmp_path / "five.jsonl"), rate=2.0))["verdict"]
    assert short_file["bound"] == "unknown" and short_file["next_commands"] == []



def test_a_window_too_short_to_judge_asks_for_the_rates_next_with_enough_requests():
    # It kept up over a window too short to judge: the rates to try next need a window that can judge them.
    doc = run_document(run_spec(Deployment(model="opt-125m", gpu="a100-40g"), workload="prefix", rate=100.0,
                                requests=20))
    v = doc["verdict"]
    assert v["window_too_short"] and v["bound"] == "arrival rate" and v["steady_requests"] > 20
    assert v["next_commands"][0]["command"] == doc["command"].replace(
        "--rate 100.0 --requests 20", f"--rate 100,150,200,300 --requests {v['steady_requests']}")
    # long enough: the run's own count stays
    long = run_document(run_spec(Deployment(model="opt-125m", gpu="a100-40g"), workload="prefix", rate=100.0,
                                 requests=400))["verdict"]
    assert not long["window_too_short"] and "--requests 400" in long["next_commands"][0]["command"]

def test_chatbot_offered_rate_differs_from_requested():
    doc = run_document(run_spec(workload="chatbot", rate=1.0, requests=120))
    v = doc["verdict"]
    assert v["requested_rate"] == 1.0 and v["offered_rate"] != pytest.approx(1.0, rel=0.05)
    assert f"offers {v['offered_rate']:.3g} req/s" in v["lines"][0]


def test_rejected_requests_are_summarized_with_reasons(tmp_path):
    trace = tmp_path / "t.jsonl"
    lines = [{"request_id": f"r{i}", "arrival_time": i * 0.5, "prompt_len": 3000 if i % 4 == 0 else 100,
              "output_len": 20} for i in range(20)]
    trace.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    result = invoke("simulate", "--trace", trace, "--out", tmp_path / "run", "--json")
    assert result.exit_code == 0, result.output
    v = json.loads(result.stdout)["verdict"]
    assert v["num_rejected"] == 5
    assert v["rejected"][0]["count"] == 5 and "exceeds the model's limit of 2048" in v["rejected"][0]["reason"]
    html = (tmp_path / "run" / "report.html").read_text()
    assert "exceeds the model" in html



def test_a_rejected_request_waits_only_until_it_is_rejected_even_the_first_at_time_zero():
    # Requests that keep up, all but the first rejected on arrival. A rejection at t = 0 once read as "never
    # started", one request waiting all run long: with the others' queue that made a light load SATURATED.
    records = _records(arrival_rate=1.0, service_rate=2.0, n=200)
    records[0] = RequestRecord("0", 0.0, 3000, 10, finish=0.0, rejected=True, reject_reason="too long")
    window = steady_window(records)
    trend = queue_trend(records, window)
    assert trend["max_waiting"] == 0 and not trend["growing"]


def test_a_run_that_rejects_every_request_says_nothing_was_served_and_what_to_change(tmp_path):
    doc = run_document(run_spec(Deployment(max_model_len=8), workload="sharegpt", rate=1.0, requests=60))
    v = doc["verdict"]
    assert v["num_rejected"] == 60 and v["bound"] == "rejections" and v["state"] == "unknown"
    assert not v["saturated"] and not v["overloaded"]
    assert "NOTHING SERVED: every one of the 60 requests was rejected" in v["lines"][1]
    assert not any("Bound by" in line or "SATURATED" in line for line in v["lines"])
    # the run's own context limit rejected them: the next run drops it (not a lower rate)
    assert v["next_commands"][0]["command"] == doc["command"].replace(" --max-model-len 8", "")
    # requests past the whole KV cache (20 + 8 tokens: two blocks of 16, and a third free before the last
    # decode): more GPUs
    cache = run_document(run_spec(Deployment(num_gpu_blocks=2, max_model_len=32, policy="paper"), workload="random",
                                  params={"input_len": 20, "output_len": 8}, rate=1.0, requests=20))["verdict"]
    assert cache["bound"] == "rejections" and "--tp 2" in cache["next_commands"][0]["command"]
    # past the model's own context: nothing in the planner's flags helps
    trace = tmp_path / "long.jsonl"
    trace.write_text("".join(json.dumps({"request_id": f"r{i}", "arrival_time": i, "prompt_len": 3000,
                                         "output_len": 8}) + "\n" for i in range(20)))
    own = run_document(run_spec(workload=str(trace)))["verdict"]
    assert own["bound"] == "rejections" and own["next_commands"] == []
    # the console names one example of each reason, as an example
    result = invoke("simulate", "--trace", trace, "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert "20 requests, e.g. r0: prompt of 3000 tokens exceeds the model's limit of 2048" in result.output

def test_latency_cdfs_say_what_they_lack_instead_of_blank_axes(tmp_path):
    from planner.report.plots import plot_latency_cdfs, pyplot
    from planner.runs.pipeline import run
    plt, figures = pyplot(), []

    class Kept:      # pyplot, keeping the figure to read back
        def subplots(self, *args, **kwargs):
            figures.append(plt.subplots(*args, **kwargs))
            return figures[-1]

        def close(self, fig):
            plt.close(fig)

    def panels(records) -> list[tuple[int, list[str]]]:
        plot_latency_cdfs(Kept(), records, tmp_path / "cdf.png")
        return [(len(ax.lines), [t.get_text() for t in ax.texts]) for ax in figures[-1][1].flat]

    rejected = run(run_spec(Deployment(max_model_len=8), workload="sharegpt", rate=1.0, requests=5)).sim.requests
    assert panels(rejected) == [(0, ["no request completed"])] * 4
    trace = tmp_path / "one_token.jsonl"          # answers of one token: a TTFT and an E2E each, no TPOT
    trace.write_text("".join(json.dumps({"request_id": f"r{i}", "arrival_time": i, "prompt_len": 30,
                                         "output_len": 1}) + "\n" for i in range(5)))
    one_token = run(run_spec(workload=str(trace))).sim.requests
    assert panels(one_token) == [(1, []), (0, ["no completed request had a second output token"]), (1, []), (1, [])]


def test_guardrails_refuse_what_vllm_refuses():
    with pytest.raises(PlannerError, match=r"holds 1136 tokens .* max_model_len is 2048: vLLM refuses to start"):
        plan_deployment(Deployment(gpu_memory_utilization=0.64))
    assert any("vLLM's CUDA kernels take" in w for w in plan_deployment(Deployment(block_size=64)).warnings)
    assert guardrails.valid_tp_sizes(resolve_model("llama-2-70b"), 8) == [1, 2, 4, 8]
    assert "did you mean h100-sxm" in str(pytest.raises(PlannerError, guardrails.gpu, "h100-smx").value)
    assert "did you mean chatbot" in str(pytest.raises(PlannerError, guardrails.workload, "chatbto").value)


def test_block_size_factor_changes_roofline_decode_attention():
    assert factor_source("cpu")                          # the data says where it came from
    assert decode_attention_factor(16) == 1.0
    model, gpu = resolve_model("opt-13b"), resolve_gpu("a100-40g")
    shape = StepShape(decode_seqs=64, decode_context=64 * 1500)
    times = {b: RooflineCostModel(model, gpu, block_size=b).breakdown(shape)["decode_attention"]
             for b in (8, 16, 32)}
    for b in (8, 32):
        assert times[b] == pytest.approx(times[16] * decode_attention_factor(b))
    assert times[8] != times[32]
    # Interpolated in log2 between measured sizes, flat outside them.
    assert decode_attention_factor(256) == decode_attention_factor(32)
    assert decode_attention_factor(16, reference=32) == pytest.approx(1 / decode_attention_factor(32))


def test_list_commands_accept_json_and_fit_80_columns():
    for what in ("gpus", "models", "workloads"):
        result = invoke("list", what, "--json")
        assert result.exit_code == 0, result.output
        rows = json.loads(result.stdout)
        assert rows and all("name" in r for r in rows)
    for what in ("gpus", "models", "workloads"):
        result = runner.invoke(app, ["list", what], env={"COLUMNS": "80"})
        assert result.exit_code == 0 and len(result.stdout.splitlines()) > 5
        assert max(len(line) for line in result.stdout.splitlines()) <= 80, what
    assert json.loads(invoke("workload", "list", "--json").stdout)[0]["name"] == "sharegpt"


def test_boolean_flags_have_canonical_names_and_aliases(tmp_path):
    problem = _boolean_flag_error(["simulate", "--prefix-caching", "true"])
    assert "--enable-prefix-caching" in problem and "--no-enable-prefix-caching" in problem
    assert _boolean_flag_error(["simulate", "--enable-prefix-caching", "--requests", "5"]) is None
    for flag, expect in (("--prefix-caching", True), ("--no-enable-prefix-caching", False)):
        result = invoke("simulate", "--workload", "prefix", "--requests", 6, "--rate", 4, flag,
                        "--preemption-mode", "swap", "--policy", "paper", "--out", tmp_path / flag, "--json")
        assert result.exit_code == 0, result.output
        params = json.loads(result.stdout)["params"]
        assert params["enable_prefix_caching"] is expect and params["preemption_mode"] == "swap"


def test_param_flag_reaches_the_workload(tmp_path):
    docs = {}
    for n in (1, 3):
        result = invoke("simulate", "--workload", "parallel", "-p", f"n={n}", "--requests", 10, "--rate", 2,
                        "--out", tmp_path / str(n), "--json")
        assert result.exit_code == 0, result.output
        docs[n] = json.loads(result.stdout)
    assert docs[3]["output_token_throughput"] > 2 * docs[1]["output_token_throughput"]
    assert "-p n=3" in docs[3]["command"]
    bad = invoke("simulate", "--workload", "parallel", "-p", "width=3", "--out", tmp_path / "bad")
    assert bad.exit_code == 2 and "width" in bad.stderr


def test_simulate_and_capacity_share_the_default_workload():
    from planner.cli.simulate import capacity, simulate

    import inspect
    assert {inspect.signature(f).parameters["workload"].default.default for f in (simulate, capacity)} == {"sharegpt"}


def test_memory_plan_labels_per_gpu_and_totals_under_tp(tmp_path):
    result = invoke("simulate", "--model", "opt-66b", "--tp", 4, "--requests", 20, "--rate", 2,
                    "--out", tmp_path)
    assert result.exit_code == 0, result.output
    assert "per GPU" in result.stdout and "all 4 GPUs" in result.stdout
    plan = json.loads((tmp_path / "result.json").read_text())["memory_plan"]
    assert f"{plan['kv_gib_total']:.2f} GiB" in result.stdout and f"{plan['kv_gib_per_gpu']:.2f} GiB" in result.stdout


def test_batch_capped_at_max_num_seqs_is_compute_bound_and_says_so():
    doc = run_document(run_spec(Deployment(max_num_seqs=8), workload="alpaca", rate=30.0, requests=300))
    v = doc["verdict"]
    assert v["overloaded"] and v["bound"] == "compute" and "max_num_seqs=8" in v["bound_reason"]
    assert "--max-num-seqs 16" in v["next_commands"][0]["command"]


def test_a_closed_loop_suggests_client_counts_not_rates():
    # A closed loop's next runs change the number of clients (a rate would be refused beside --concurrency).
    doc = run_document(run_spec(Deployment(model="llama-3.1-8b", gpu="h100-sxm"), workload="sharegpt",
                                concurrency=8, requests=200))
    v = doc["verdict"]
    assert v["bound"] == "arrival rate" and "its 8 clients" in v["bound_reason"]
    commands = [c["command"] for c in v["next_commands"]]
    assert "--concurrency 8,16,32,64" in commands[0] and "--rate" not in commands[0]
    assert commands[1].startswith("planner capacity") and "--concurrency max" in commands[1]


def test_a_closed_loop_over_k_active_conversations_suggests_no_more_clients_than_k():
    # vLLM's multi-turn benchmark refuses more clients than active conversations: the suggested counts stop at K,
    # so the next command runs
    doc = run_document(run_spec(Deployment(model="llama-3.1-8b", gpu="h100-sxm", max_active_conversations=16),
                                workload="chatbot", concurrency=4, requests=200))
    command = doc["verdict"]["next_commands"][0]["command"]
    assert "--concurrency 4,8,16 " in command and "--max-active-conversations 16" in command
