"""Closed-loop load: N clients, each sending its next request the moment its previous one ends."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from engine.deployment import Deployment
from planner import capacity, simulate
from planner.cli import app
from planner.cost.linear import LinearCostModel
from planner.sim import simulate as simulate_trace
from sim_helpers import sim_plan
from workloads import make_trace

H100 = Deployment(model="llama-3.1-8b", gpu="h100-sxm", policy="vllm-v1", max_model_len=4096)


def closed(clients: int, **options):
    trace = make_trace("random", num_requests=40, rate=1.0, seed=0, input_len=200, output_len=30, range_ratio=0.5)
    return simulate_trace(trace, sim_plan("opt-125m", "a100-40g", policy="paper"), LinearCostModel(0.01, 1e-4),
                          concurrency=clients, **options)


def test_one_client_sends_each_request_when_the_previous_one_ends():
    result = closed(1)
    records = result.requests
    assert records[0].arrival == 0.0
    assert all(b.arrival == a.finish for a, b in zip(records, records[1:]))
    assert result.metrics.mean_concurrency == pytest.approx(1.0)


@pytest.mark.parametrize("clients", [3, 8])
def test_never_more_requests_in_flight_than_clients_and_the_loop_stays_full(clients):
    result = closed(clients)
    records = result.requests
    events = sorted([(r.arrival, 1) for r in records] + [(r.finish, -1) for r in records],
                    key=lambda e: (e[0], e[1]))       # at one instant an end frees the client first
    in_flight, most = 0, 0
    for _, change in events:
        in_flight += change
        most = max(most, in_flight)
    assert most == clients
    assert clients - 1 < result.metrics.mean_concurrency <= clients    # full until the last requests drain
    assert result.params["concurrency"] == clients


def test_fast_forward_gives_the_step_by_step_result_in_a_closed_loop():
    fast, slow = closed(6), closed(6, fast_forward=False)
    assert fast.fast_forwarded_steps > 0
    assert fast.requests == slow.requests and fast.steps == slow.steps


def test_more_clients_more_throughput_and_longer_tpot_until_compute_binds():
    runs = [simulate(H100, workload="random", params={"input_len": 1024, "output_len": 128}, requests=120,
                     concurrency=c).metrics for c in (1, 8, 32)]
    assert runs[0].request_throughput < runs[1].request_throughput < runs[2].request_throughput
    assert runs[0].tpot_mean < runs[1].tpot_mean < runs[2].tpot_mean


def paced(rate: float, clients: int | None, **options):
    """vllm bench serve's --request-rate with --max-concurrency: Poisson arrivals, at most `clients` in flight."""
    trace = make_trace("random", num_requests=60, rate=rate, seed=0, input_len=200, output_len=30, range_ratio=0.5)
    return trace, simulate_trace(trace, sim_plan("opt-125m", "a100-40g", policy="paper"),
                                 LinearCostModel(0.01, 1e-4), concurrency=clients, paced=clients is not None,
                                 **options)


def test_a_rate_with_a_limit_never_reached_is_the_open_loop_at_that_rate():
    _, open_loop = paced(2.0, None)
    _, limited = paced(2.0, 60)
    assert limited.requests == open_loop.requests and limited.steps == open_loop.steps


def test_a_rate_with_a_limit_sends_each_request_when_due_or_when_a_slot_frees():
    trace, result = paced(20.0, 3)
    records = {r.request_id: r for r in result.requests}
    sent = [records[req.request_id].arrival for req in trace]
    due = [req.arrival_time for req in trace]
    assert sent == sorted(sent)                                        # in the trace's order (vLLM bench's FIFO slots)
    assert all(s >= d for s, d in zip(sent, due))                      # never before it is due
    assert sum(s > d for s, d in zip(sent, due)) > len(trace) // 2    # at 20 req/s most wait for a slot
    ends = sorted(r.finish for r in result.requests)
    # the first three when due; each later one when due or, if three are out then, when the (k-3)th one ends
    assert sent == [d if k < 3 else max(d, ends[k - 3]) for k, d in enumerate(due)]
    events = sorted([(r.arrival, 1) for r in result.requests] + [(r.finish, -1) for r in result.requests],
                    key=lambda e: (e[0], e[1]))
    in_flight = most = 0
    for _, change in events:
        in_flight += change
        most = max(most, in_flight)
    assert most == 3


def test_fast_forward_gives_the_step_by_step_result_with_a_rate_and_a_limit():
    _, fast = paced(8.0, 4)
    _, slow = paced(8.0, 4, fast_forward=False)
    assert fast.fast_forwarded_steps > 0
    assert fast.requests == slow.requests and fast.steps == slow.steps


def test_a_rate_and_a_concurrency_together_run_as_vllm_bench_runs_them():
    m = simulate(H100, workload="random", params={"input_len": 512, "output_len": 64}, requests=80, rate=50.0,
                 concurrency=4).metrics
    alone = simulate(H100, workload="random", params={"input_len": 512, "output_len": 64}, requests=80,
                     concurrency=4).metrics
    assert m.mean_concurrency <= 4 and m.request_throughput < 50.0
    assert m.request_throughput == pytest.approx(alone.request_throughput, rel=0.1)   # the limit binds, not the rate


def test_capacity_in_clients_is_the_most_clients_within_the_slo():
    found = capacity(H100, slos={"tpot_p99": 0.012}, workload="random", params={"input_len": 512, "output_len": 64},
                     requests=100, clients=True)
    n = found.rate
    assert n is not None and found.document["capacity_concurrency"] == n and found.document["capacity_rate"] is None
    by_clients = {p["concurrency"]: p for p in found.document["probes"]}
    assert by_clients[n]["meets"] and not by_clients[n + 1]["meets"]      # bisected to one client


def test_capacity_in_clients_stops_at_the_traces_requests():
    # past 40 clients every request of a 40-request trace is in flight at once: more clients change nothing
    found = capacity(H100, slos={"tpot_p99": 1.0}, workload="random", params={"input_len": 256, "output_len": 16},
                     requests=40, clients=True)
    assert found.rate == 40 and not found.found.bounded
    assert max(p["concurrency"] for p in found.document["probes"]) == 40
    assert found.document["verdict"]["lines"][0].startswith("Capacity: at least 40 clients")
    assert "give more --requests" in found.document["verdict"]["lines"][0]



def test_a_search_of_clients_that_finds_none_suggests_a_search_of_clients():
    # not one client within the SLO: the next search is of clients again (it read as a rate search once)
    found = capacity(H100, slos={"ttft_p99": 1e-6}, workload="random", params={"input_len": 256, "output_len": 16},
                     requests=20, clients=True)
    assert found.rate is None
    command = found.document["verdict"]["next_command"]
    assert "--slo ttft_p99=1e-06" in command and "--concurrency max" in command and "--tp 2" in command
    assert command == found.spec.command(capacity=True, concurrency="max", tp=2)

@pytest.mark.parametrize("command", [["simulate", "--concurrency", "4"],
                                     ["capacity", "--concurrency", "max", "--slo", "tpot_p99=0.03"]])
def test_a_duration_for_a_closed_loop_is_refused_in_one_line_before_anything_runs(command, tmp_path):
    # a built-in workload's --duration times arrivals, which clients sending as their requests end do not have
    result = CliRunner().invoke(app, [*command, "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--duration", "60",
                                      "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert result.stderr == ("error: --duration is seconds of arrivals, and a closed loop (--concurrency) sends each "
                             "request when the one before ends: give --requests N instead (or a --rate)\n")
    assert not (tmp_path / "run").exists()


def test_cli_sweeps_concurrency_and_names_it_in_the_command(tmp_path):
    result = CliRunner().invoke(app, ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--policy",
                                      "vllm-v1", "--max-model-len", "4096", "--workload", "random", "--requests",
                                      "60", "--concurrency", "2,16", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["verdict"]["swept"] == ["concurrency"]
    assert [r["params"]["concurrency"] for r in doc["runs"]] == [2, 16]
    assert all("--concurrency" in r["command"] for r in doc["runs"])


def test_search_in_clients_finds_the_cheapest_configuration_for_n_users():
    from planner import search
    found = search(H100, slos="tpot_p99=0.03", gpus=["h100-sxm", "a100-80g"], workload="random",
                   params={"input_len": 512, "output_len": 64}, requests=100, clients=16, workers=1)
    doc = found.document()
    assert doc["capacity_unit"] == "clients" and doc["target_rate"] == 16
    assert found.best is not None and found.best["capacity"] >= 16
    assert all(isinstance(r["capacity"], int) for r in found.configs if r["capacity"] is not None)


def test_a_fleet_keeps_the_limit_over_all_its_replicas():
    from planner.runs.spec import Fleet, Load, RunSpec
    load = Load(workload="random", params=(("input_len", 512), ("output_len", 64)), rate=50.0, requests=80,
                concurrency=6)
    result = simulate(RunSpec(deployment=H100, load=load, fleet=Fleet(2, "least-requests")))
    records = result.sim.requests
    events = sorted([(r.arrival, 1) for r in records] + [(r.finish, -1) for r in records], key=lambda e: (e[0], e[1]))
    in_flight = most = 0
    for _, change in events:
        in_flight += change
        most = max(most, in_flight)
    assert most == 6 and result.sim.params["concurrency"] == 6
    first = sorted(r.arrival for r in records)[:6]      # sent as they come due, not all six at time 0
    assert first[0] == 0.0 and all(a < b for a, b in zip(first, first[1:]))
