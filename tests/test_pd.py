"""Prefill/decode disaggregation (planner/sim/pd.py, planner/sim/remote_kv.py, docs/pd.md): the client's
TTFT is the prefill plus the hand-off, the transfer and the first decode-side step; KV bytes follow the
model; a short pool binds; bad --pd values and combinations are one line."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from engine.deployment import Deployment
from planner.analysis.pd import which_binds
from planner.catalog.links import KvLink, resolve_link
from planner.cli.app import app
from planner.errors import PlannerError
from planner.runs.pd import Disaggregation, parse_pd, parse_pool_set
from planner.runs.pipeline import Simulation, prepare_pools
from planner.runs.spec import Fleet, Load, RunSpec
from planner.sim.pd import KvPath, simulate_pd
from planner.sim.router import parse_router

runner = CliRunner()
V1 = Deployment.of(model="llama-3.1-8b", gpu="h100-sxm", policy="vllm-v1")
INSTANT = KvLink("instant", math.inf, 0.0, "test", "test")


def pd_spec(prefill: int, decode: int, load: Load, deployment: Deployment = V1, **pools) -> RunSpec:
    return RunSpec(deployment=deployment, load=load, pd=Disaggregation(prefill, decode, **pools))


def random_load(**changes) -> Load:
    params = {"input_len": 2000, "output_len": 50, **changes.pop("params", {})}
    return Load(workload="random", params=tuple(params.items()), **{"requests": 60, "rate": 2.0, **changes})


def test_instant_transfer_and_idle_pools_give_the_prefill_time_plus_one_decode_step():
    load = random_load(rate=0.2, requests=30)         # one request at a time: nothing rides along a prefill
    pools = prepare_pools(pd_spec(8, 8, load))
    path = KvPath(INSTANT, math.inf, 1, pools.path.bytes_per_token)
    trace = load.trace()
    sim = simulate_pd(trace, pools.prefill, pools.decode, path, parse_router("least-requests"))
    assert sim.metrics.num_completed == len(trace)
    prefill = {r.request_id: r for r in sim.pd.prefill.requests}
    for client, remote, group in zip(sim.requests, sim.pd.remotes, sim.pd.handed):
        assert client.request_id == group.request_id
        done = prefill[client.request_id].first_token          # the prefill replica's (discarded) token
        assert remote.handed_at == done and remote.allocated_at == done and remote.admitted_at == done
        first_step = sim.pd.decode.requests[0].tpot          # a decode step of a lightly loaded replica
        assert client.first_token - done == pytest.approx(first_step, rel=0.2)
    doc = sim.summary()
    parts = doc["pd"]["ttft_parts_mean"]
    assert parts["kv_transfer"] == 0 and parts["decode_admission"] == 0 and parts["decode_start"] == 0
    assert sum(parts.values()) == pytest.approx(doc["ttft_mean"])
    assert doc["pd"]["prefill"]["queue_wait"]["p99"] < 0.05 * doc["pd"]["prefill"]["prefill_time"]["mean"]
    # Against one aggregated replica of the same deployment on the same trace (whose prefill step samples
    # the first token): the prefill is the same, the hand-off adds the decode replica's first step.
    aggregated = Simulation.prepare(RunSpec(deployment=V1, load=load)).simulate()
    assert doc["pd"]["prefill"]["time_to_kv"]["mean"] == pytest.approx(aggregated.metrics.ttft_mean, rel=0.05)
    assert doc["ttft_mean"] - aggregated.metrics.ttft_mean == pytest.approx(parts["first_decode_step"], rel=0.25)


def test_kv_bytes_follow_the_model_and_the_link():
    spec = pd_spec(1, 1, random_load(), Deployment.of(model="llama-3.1-70b", gpu="h100-sxm", tp=4, policy="vllm-v1"),
                   decode_tp=8, kv_link="infiniband")
    path = prepare_pools(spec).path
    assert path.bytes_per_token == 2 * 80 * 8 * 128 * 2      # K and V x 80 layers x 8 KV heads x 128 x bf16
    assert path.streams == 4                                  # min(prefill TP 4, decode TP 8)
    num_bytes, seconds = path.seconds(8000)
    assert num_bytes == 8000 * 327_680
    assert seconds == pytest.approx(1e-5 + 8000 * 327_680 / (50e9 * 4))
    fp8 = prepare_pools(pd_spec(1, 1, random_load(), V1.replace(kv_cache_dtype="fp8"))).path
    assert fp8.bytes_per_token == 2 * 32 * 8 * 128 * 1


def test_a_speculating_decode_pool_drafts_from_the_prompts_draft_kv_the_prefill_pool_made():
    load = random_load(requests=40, rate=4.0, params={"input_len": 1000, "output_len": 100})
    plain = Simulation.prepare(pd_spec(1, 1, load)).run()
    spec = Simulation.prepare(pd_spec(1, 1, load, V1.replace(speculative="eagle:3"))).run()
    # the EAGLE head's one layer of KV crosses with the target's 32
    path = prepare_pools(pd_spec(1, 1, load, V1.replace(speculative="eagle:3"))).path
    assert path.bytes_per_token == 2 * 33 * 8 * 128 * 2
    stats = spec.document()["spec_decoding_stats"]
    assert stats["num_drafts"] > 0 and stats["mean_acceptance_length"] > 1.5
    assert spec.metrics.tpot_mean < 0.7 * plain.metrics.tpot_mean
    # the head's own pass over each prompt runs on the prefill replica
    assert spec.sim.pd.prefill.metrics.step_time_mean > plain.sim.pd.prefill.metrics.step_time_mean


def test_the_run_moves_each_prompts_kv():
    result = Simulation.prepare(pd_spec(1, 2, random_load(requests=20))).run()
    kv = result.document()["pd"]["kv_transfer"]
    assert kv["count"] == 20
    assert kv["bytes_total"] == 20 * 2000 * kv["kv_bytes_per_token"]
    assert kv["seconds"]["mean"] == pytest.approx(1e-5 + 2000 * kv["kv_bytes_per_token"] / 50e9)


def test_the_decode_pool_schedules_by_priority():
    # --scheduling-policy priority with --pd: the decode instances' waiting pass (remote prefills among the
    # core's own requests) keeps the priority queue; each class gets its latencies
    load = random_load(requests=40, rate=20.0, params={"low_priority_share": 0.5})
    doc = Simulation.prepare(pd_spec(1, 1, load, V1.replace(scheduling_policy="priority"))).run().document()
    assert doc["num_completed"] == 40 and set(doc["by_priority"]) == {"0", "1"}


def test_a_pool_replica_of_dp_ranks_has_each_ranks_seats_and_steps_them_together():
    """A decode replica of --dp 2 is two engines, each with max_num_seqs seats and its own cache (a MoE model's
    ranks in lockstep), as the aggregated deployment's ranks are: eight clients fit a pool replica of two ranks of
    four seats. Until stop 69 each pool replica was one engine, whatever its dp: half the seats, and queueing."""
    moe = Deployment.of(model="qwen3-30b-a3b", gpu="h100-sxm", dp=2, enable_expert_parallel=True, max_num_seqs=4)
    load = random_load(requests=32, rate=None, concurrency=8, params={"input_len": 200, "output_len": 100})
    result = Simulation.prepare(pd_spec(1, 1, load, moe)).run()
    doc = result.sim.summary()["pd"]
    decode = doc["decode"]
    assert doc["ratio"] == "1:1" and decode["replicas"] == 1 and decode["gpus"] == 2
    assert len(decode["per_replica"]) == 2 and all(row["num_requests"] > 0 for row in decode["per_replica"])
    # a seat for every client's request at once: no wait beyond the step under way (one engine of four seats,
    # dp 1, waits about 0.7 s for one)
    assert decode["admission_wait"]["max"] < 1.5 * decode["tpot"]["mean"]
    one = Simulation.prepare(pd_spec(1, 1, load, moe.replace(dp=1, enable_expert_parallel=False))).run()
    assert one.sim.summary()["pd"]["decode"]["admission_wait"]["mean"] > 20 * decode["tpot"]["mean"]
    steps = [s for s, pool in zip(result.sim.steps, result.sim.pd.step_pools) if pool == 1]
    ranks = [r for r, pool in zip(result.sim.pd.step_columns()["replica"], result.sim.pd.step_pools) if pool == 1]
    ends = {rank: {round(s.end, 9) for s, r in zip(steps, ranks) if r == rank} for rank in (0, 1)}
    assert ends[0] & ends[1]                           # lockstep: the ranks' steps end together


def test_a_decode_pool_too_small_binds_decode():
    load = random_load(requests=80, rate=8.0, params={"input_len": 500, "output_len": 400})
    result = Simulation.prepare(pd_spec(2, 1, load, V1.replace(max_num_seqs=8))).run()
    found = result.verdict["pd"]
    assert found["binds"] == "decode" and found["decode_saturated"] and not found["prefill_saturated"]
    assert "the decode pool binds" in result.verdict["lines"][0]
    # The next command adds a replica to the pool that binds, not a setting a pool's own could override
    # (a doubled --max-num-seqs reached only the prefill pool under --decode-set max_num_seqs=8).
    nxt = result.verdict["next_commands"][0]
    assert "--pd 2:2" in nxt["command"] and nxt["why"] == "one more decode replica"
    assert result.verdict["lines"][-1].startswith("Next: ") and "--pd 2:2" in result.verdict["lines"][-1]
    assert not any("--max-num-seqs 16" in c["command"] for c in result.verdict["next_commands"])


def test_a_prefill_pool_too_small_binds_prefill():
    load = random_load(requests=40, rate=6.0, params={"input_len": 8000, "output_len": 20})
    result = Simulation.prepare(pd_spec(1, 2, load)).run()
    found = result.verdict["pd"]
    assert found["binds"] == "prefill" and found["prefill_saturated"] and not found["decode_saturated"]
    pools = result.document()["pd"]
    assert pools["prefill"]["utilization"] > 0.9


def test_neither_pool_saturated_names_the_busier():
    pd = {"prefill": {"queue_wait": {"mean": 0.001}, "prefill_time": {"mean": 0.05}, "utilization": 0.6},
          "decode": {"admission_wait": {"mean": 0.001}, "start_wait": {"mean": 0.002}, "tpot": {"mean": 0.01},
                     "first_step": {"mean": 0.01}, "mean_batch_size": 20, "max_num_seqs": 256,
                     "kv_utilization": 0.3}}
    assert which_binds(pd)["binds"] == "prefill" and not which_binds(pd)["saturated"]
    pd["decode"]["kv_utilization"] = 0.8
    assert which_binds(pd)["binds"] == "decode"


def test_a_run_whose_requests_are_all_refused_still_has_a_verdict():
    # vllm-v1 refuses parallel sampling with chunked prefill (as vLLM does): the pools see no work and no time
    # passes, so their utilization is undefined; the verdict still reads, naming the refusals.
    load = Load(workload="parallel", requests=1, concurrency=4)
    result = Simulation.prepare(pd_spec(2, 2, load)).run()
    assert result.document()["pd"]["prefill"]["utilization"] is None
    assert result.metrics.num_completed == 0
    assert "prefill: 0% busy" in result.verdict["lines"][0]
    assert "NOTHING SERVED: its one request was rejected (reasons below)." in result.verdict["lines"]


def test_a_closed_loop_runs_through_both_pools():
    load = random_load(requests=30, rate=None, concurrency=4)
    result = Simulation.prepare(pd_spec(1, 1, load)).run()
    assert result.metrics.num_completed == 30
    arrivals = sorted(r.arrival for r in result.sim.requests)
    assert arrivals[:4] == [0.0] * 4 and arrivals[4] > 0


def test_served_clients_send_a_turnaround_after_their_request_ends_at_the_decode_pool():
    load = random_load(requests=30, rate=None, concurrency=4)
    result = Simulation.prepare(pd_spec(1, 1, load, V1.replace(client_turnaround=0.002))).run()
    requests = result.sim.requests
    assert result.metrics.num_completed == 30
    finishes = [r.finish for r in requests]
    for r in sorted(requests, key=lambda r: r.arrival)[4:]:
        assert any(r.arrival == pytest.approx(f + 0.002, abs=1e-12) for f in finishes)


def test_a_request_the_decode_pool_cannot_hold_is_rejected_there():
    small = V1.replace(max_model_len=1024)           # the decode pool's limit: a 2,000-token prompt never runs there
    pools = prepare_pools(pd_spec(1, 1, random_load(requests=5)))
    small_pool = prepare_pools(pd_spec(1, 1, random_load(requests=5), small)).decode
    sim = simulate_pd(random_load(requests=5).trace(), pools.prefill, small_pool, pools.path, parse_router(None))
    assert sim.metrics.num_rejected == 5 and all(r.rejected for r in sim.requests)
    assert sim.pd.prefill.metrics.num_completed == 5 and not any(r.allocated_at for r in sim.pd.remotes)
    assert sim.kv_blocks_used_at_end == 2           # vLLM v1's null block in each replica: the prefill one let go


@pytest.mark.parametrize("text", ["2", "a:b", "0:3", "2:0", "-1:2", "1:2:3"])
def test_bad_pd_values_are_refused(text):
    with pytest.raises(PlannerError, match="--pd"):
        parse_pd(text)


@pytest.mark.parametrize("spec,message", [
    (RunSpec(deployment=V1, fleet=Fleet(2), pd=Disaggregation(1, 1)), "replaces --replicas"),
    (RunSpec(deployment=V1.replace(policy="paper"), pd=Disaggregation(1, 1)), "--policy vllm-v1"),
    (RunSpec(deployment=V1, pd=Disaggregation(3, 6, kv_link="nvlink")), "one node"),
    (RunSpec(deployment=V1.replace(gpu="l40s"), pd=Disaggregation(1, 1, kv_link="nvlink")), "no NVLink"),
    (RunSpec(deployment=V1, pd=Disaggregation(1, 1, kv_link="carrier-pigeon")), "unknown KV link"),
])
def test_combinations_that_make_no_sense_are_refused(spec, message):
    with pytest.raises(PlannerError, match=message):
        Simulation.prepare(spec)


BASE = ("--model", "llama-3.1-8b", "--gpu", "h100", "--requests", 20, "--workload", "random",
        "-p", "input_len=1000", "-p", "output_len=20")


@pytest.mark.parametrize("args,message", [
    (("--pd", "0:1", "--policy", "vllm-v1"), "at least one replica"),
    (("--pd", "two", "--policy", "vllm-v1"), "give P:D"),
    (("--pd", "1:1", "--policy", "paper"), "--policy vllm-v1"),
    (("--pd", "1:1,1:2", "--policy", "vllm-v1"), "one P:D"),
    (("--prefill-tp", 2, "--policy", "vllm-v1"), "give --pd"),
    (("--pd", "1:1", "--replicas", 2, "--policy", "vllm-v1"), "replaces --replicas"),
    (("--pd", "4:8", "--kv-link", "nvlink", "--policy", "vllm-v1"), "one node"),
    (("--pd", "1:1", "--policy", "vllm-v1", "--decode-tp", 3), "the decode pool: tensor parallel size 3 (--decode-tp)"),
])
@pytest.mark.parametrize("command", ["simulate", "capacity"])
def test_cli_refuses_bad_pd_in_one_line(tmp_path, command, args, message):
    extra = ("--slo", "ttft_p99=1") if command == "capacity" else ("--rate", 4)
    result = runner.invoke(app, [str(a) for a in (command, *BASE, *args, *extra, "--out", tmp_path / "x")])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_cli_writes_the_pd_block(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, [str(a) for a in ("simulate", *BASE, "--rate", 4, "--policy", "vllm-v1", "--pd",
                                                  "1:2", "--decode-tp", 2, "--kv-link", "ethernet", "--out", out,
                                                  "--json")])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "result.json").read_text())
    pd = doc["pd"]
    assert pd["ratio"] == "1:2" and pd["decode"]["tp"] == 2 and pd["prefill"]["tp"] == 1
    assert pd["kv_transfer"]["link"] == "ethernet" and pd["kv_transfer"]["streams"] == 1
    assert len(pd["decode"]["per_replica"]) == 2 and pd["decode"]["num_requests"] == 20
    wait = pd["decode"]["wait"]        # each request's two waits together (the table's mean and p99 agree)
    assert wait["p99"] >= wait["mean"] and wait["max"] >= wait["p99"]
    assert doc["verdict"]["pd"]["binds"] in ("prefill", "decode")
    assert "--pd 1:2 --decode-tp 2 --kv-link ethernet" in doc["command"]
    assert doc["num_completed"] == 20 and doc["params"]["pd"] == "1:2"
    assert resolve_link("eth").name == "ethernet"


SEARCH = ("search", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", 1, "--policy", "vllm-v1", "--workload",
          "random", "-p", "input_len=4000", "-p", "output_len=100", "--duration", 15,
          "--slo", "ttft_p99=1,tpot_p99=0.03")


def test_search_pd_keeps_the_dp_layout_it_is_given(tmp_path):
    """--dp and --enable-expert-parallel reach both the pools and the aggregated comparison (they were dropped
    until stop 69: a --dp 2 search counted one GPU a replica)."""
    out = tmp_path / "search"
    result = runner.invoke(app, [str(a) for a in (
        "search", "--model", "qwen3-30b-a3b", "--gpu", "h100-sxm", "--tp", 1, "--dp", 2, "--enable-expert-parallel",
        "--workload", "random", "-p", "input_len=500", "-p", "output_len=50", "--requests", 60, "--rate", 4,
        "--slo", "ttft_p99=2,tpot_p99=0.1", "--pd", "1:1", "--out", out, "--json")])
    assert result.exit_code == 0, result.output
    config = json.loads((out / "pd_search.json").read_text())["configs"][0]
    assert config["aggregated"]["gpus"] == 2 * config["aggregated"]["replicas"]
    assert config["best"]["gpus"] == 4
    command = config["best"]["command"]      # reproduces the best: the layout, the GPU, the ratio and the rate
    assert "--gpu h100-sxm --dp 2 --enable-expert-parallel" in command and "--pd 1:1" in command
    assert "--rate 4" in command
    refused = runner.invoke(app, [str(a) for a in (*SEARCH, "--dp", "1,2", "--rate", 20, "--pd", "auto",
                                                   "--out", tmp_path / "x")])
    assert refused.exit_code == 2 and "--dp: one value in a P/D search (--pd)" in refused.output
    # --block-size and --max-num-seqs reach the pools too (also dropped until stop 69): one value each
    several = runner.invoke(app, [str(a) for a in (*SEARCH, "--max-num-seqs", "4,8", "--rate", 20, "--pd", "auto",
                                                   "--out", tmp_path / "y")])
    assert several.exit_code == 2 and "--max-num-seqs: one value in a P/D search (--pd)" in several.output


def test_search_pd_auto_finds_a_ratio_and_says_what_binds_one_replica_short(tmp_path):
    out = tmp_path / "search"
    result = runner.invoke(app, [str(a) for a in (*SEARCH, "--rate", 20, "--pd", "auto", "--out", out, "--json")])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "pd_search.json").read_text())
    config = doc["configs"][0]
    best, aggregated = config["best"], config["aggregated"]
    assert best["meets"] and aggregated["meets"]
    near = {r["pd"]: r for r in config["neighbours"]}
    p, d = best["prefill"], best["decode"]
    for pair in ((p - 1, d), (p, d - 1)):
        if min(pair) >= 1:        # one replica fewer in either pool misses (the answer is the fewest)
            row = near[f"{pair[0]}:{pair[1]}"]
            assert not row["meets"] and row["binds"] in ("prefill", "decode")
    if p > 1:
        assert near[f"{p - 1}:{d}"]["binds"] == "prefill"
    assert best["cost_per_hour"] == pytest.approx(best["gpus"] * doc["prices"]["h100-sxm"])
    assert "pd" in (out / "configs.csv").read_text().splitlines()[0]


@pytest.mark.parametrize("args,message", [
    (("--rate", "max", "--pd", "auto"), "give --rate"),
    (("--rate", 20, "--pd", "auto", "--replicas", 2), "leave out --replicas"),
    (("--rate", 20, "--pd", "1:x"), "give P:D"),
    (("--rate", 20, "--decode-tp", 2), "give --pd"),
])
def test_search_refuses_bad_pd_in_one_line(tmp_path, args, message):
    result = runner.invoke(app, [str(a) for a in (*SEARCH, *args, "--out", tmp_path / "x")])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_result_json_documents_the_pd_block():
    from test_result_schema import DOCUMENTED, undocumented

    doc = Simulation.prepare(pd_spec(1, 2, random_load(requests=20))).run().document()
    pd = doc["pd"]
    assert "pd" in DOCUMENTED
    for part in (pd, pd["prefill"], pd["decode"], pd["kv_transfer"], pd["ttft_parts_mean"], doc["verdict"]["pd"],
                 pd["prefill"]["queue_wait"], *pd["decode"]["per_replica"]):
        assert not undocumented(part), part
    assert {"pd", "router"} <= set(doc["params"]) <= DOCUMENTED


def test_capacity_of_pools_says_which_pool_binds_at_capacity(tmp_path):
    out = tmp_path / "capacity"
    result = runner.invoke(app, [str(a) for a in ("capacity", "--model", "llama-3.1-8b", "--gpu", "h100", "--workload", "random", "-p", "input_len=4000",
                                                  "-p", "output_len=50", "--duration", 10, "--policy", "vllm-v1",
                                                  "--pd", "1:1", "--slo", "ttft_p99=1", "--out", out, "--json")])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "capacity.json").read_text())
    assert doc["capacity_rate"] > 0 and doc["at_capacity"]["pd"]["ratio"] == "1:1"
    assert any(line.startswith("At capacity: P/D 1:1") for line in doc["verdict"]["lines"])


@pytest.mark.parametrize("router", ["round-robin", "least-requests"])
def test_fast_forward_and_step_by_step_agree(router):
    load = random_load(requests=40, rate=6.0, params={"input_len": 3000, "output_len": 80})
    spec = replace(pd_spec(2, 2, load), fleet=Fleet(1, router))
    fast, slow = (Simulation.prepare(replace(spec, step_by_step=s)).simulate() for s in (False, True))
    assert fast.requests == slow.requests and fast.steps == slow.steps
    assert fast.summary()["pd"] == slow.summary()["pd"]


def test_the_run_folder_says_each_requests_replicas_and_each_steps_pool(tmp_path):
    import csv

    out = tmp_path / "run"
    result = runner.invoke(app, [str(a) for a in ("simulate", *BASE, "--rate", 4, "--policy", "vllm-v1", "--pd",
                                                  "2:3", "--router", "least-requests", "--out", out)])
    assert result.exit_code == 0, result.output
    requests = list(csv.DictReader((out / "requests.csv").open()))
    assert {r["prefill_replica"] for r in requests} == {"0", "1"}
    assert {r["decode_replica"] for r in requests} == {"0", "1", "2"}
    steps = list(csv.DictReader((out / "steps.csv").open()))
    doc = json.loads((out / "result.json").read_text())
    for pool in ("prefill", "decode"):
        mine = [s for s in steps if s["pool"] == pool]
        assert len(mine) == doc["pd"][pool]["num_steps"]
        for row in doc["pd"][pool]["per_replica"]:
            assert sum(s["replica"] == str(row["replica"]) for s in mine) == row["num_steps"]
    assert [float(s["start"]) for s in steps] == sorted(float(s["start"]) for s in steps)


def test_the_prefill_replica_holds_the_kv_until_the_decode_replica_has_read_it():
    load = random_load(requests=30, rate=2.0)
    pools = prepare_pools(pd_spec(1, 1, load))
    trickle = KvLink("trickle", 1e9, 0.0, "test", "test")     # 1 GB/s: a 2,000-token prompt's 262 MB in 0.26 s
    runs = {name: simulate_pd(load.trace(), pools.prefill, pools.decode,
                              KvPath(link, link.bandwidth, 1, pools.path.bytes_per_token), parse_router(None))
            for name, link in (("instant", INSTANT), ("trickle", trickle))}
    slow = runs["trickle"].pd
    assert all(r.seconds == pytest.approx(0.262144) for r in slow.remotes)
    held = [s.kv_blocks_used for s in slow.prefill.steps]
    idle = [s.kv_blocks_used for s in runs["instant"].pd.prefill.steps]
    # A prefill step sees earlier requests' KV (125 blocks each) still held while it crosses the slow link;
    # with an instant link only the prompts in progress hold blocks.
    assert max(held) > max(idle)
    # Exactly: each step's blocks are its own prompts' plus those of the requests still crossing the link.
    for step in slow.prefill.steps:
        crossing = sum(r.handed_at < step.start < r.arrived_at for r in slow.remotes)
        assert step.kv_blocks_used >= 1 + 125 * crossing
    assert runs["trickle"].kv_blocks_used_at_end == 2             # the two replicas' null blocks


def test_with_prefix_caching_the_decode_replica_reads_only_what_it_lacks():
    load = Load(workload="prefix", params=(("num_prefixes", 2), ("prefix_len", 512)), requests=30, rate=5.0)
    spec = pd_spec(1, 1, load, V1.replace(enable_prefix_caching=True))
    spec = replace(spec, fleet=Fleet(1, "prefix-aware"))
    sim = Simulation.prepare(spec).simulate()
    assert sim.metrics.num_completed == 30
    prompts = {r.request_id: r.prompt_len for r in sim.requests}
    tokens = [(r.tokens, prompts[g.request_id]) for g, r in zip(sim.pd.handed, sim.pd.remotes)]
    assert tokens[0][0] == tokens[0][1]                       # the first prompt: nothing cached yet
    assert sum(moved < prompt for moved, prompt in tokens) >= 20  # later ones hit their prefix's blocks
    assert all(prompt - moved in (0, 512) for moved, prompt in tokens)   # 32 full blocks of 16 or none
    doc = sim.summary()["pd"]["kv_transfer"]
    assert doc["bytes_total"] == sum(moved for moved, _ in tokens) * doc["kv_bytes_per_token"]


def test_a_data_parallel_pool_counts_every_gpu(tmp_path):
    # a dp 2 x EP 2 replica takes two GPUs in either pool
    moe = Deployment(model="qwen3-30b-a3b", gpu="h100-sxm", dp=2, enable_expert_parallel=True)
    pools = Disaggregation(1, 2, decode_tp=2)
    assert pools.gpus(moe) == 1 * 2 + 2 * 4
    result = CliRunner().invoke(app, ["simulate", "--model", "qwen3-30b-a3b", "--gpu", "h100-sxm", "--dp", "2",
                                      "--enable-expert-parallel", "--pd", "1:1", "--requests", "20", "--rate", "4",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "result.json").read_text())
    assert doc["pd"]["prefill"]["gpus"] == 2 and doc["pd"]["decode"]["gpus"] == 2
    assert doc["pd"]["decode"]["deployment"]["dp"] == 2


def test_each_pool_takes_settings_of_its_own():
    pools = Disaggregation(1, 2, prefill_set=parse_pool_set("prefill", ["max_num_batched_tokens=16384"]),
                           decode_set=parse_pool_set("decode", ["max-num-seqs=64", "async_scheduling=false"]))
    prefill, decode = pools.pools(V1)
    assert prefill.max_num_batched_tokens == 16384 and prefill.max_num_seqs == V1.max_num_seqs
    assert decode.max_num_seqs == 64 and decode.async_scheduling is False
    assert decode.max_num_batched_tokens == V1.max_num_batched_tokens
    assert pools.flags() == ["--pd", "1:2", "--prefill-set", "max_num_batched_tokens=16384",
                             "--decode-set", "max_num_seqs=64", "--decode-set", "async_scheduling=false"]


@pytest.mark.parametrize("item, message", [
    ("model=opt-125m", "a pool sets apart only dp"),
    ("gpu=h200", "--prefill-gpu and --prefill-tp set its GPU and TP"),
    ("max_num_seqs", "give KEY=VALUE"),
    ("max_num_seqs=lots", "give a whole number"),
    ("max_num_seqs=0", "the prefill pool: max_num_seqs must be >= 1"),
    ("all2all_backend=deepep", "the prefill pool: all2all_backend 'deepep' is not supported"),
    ("enable_eplb=true", "the prefill pool: enable_expert_parallel must be True to use EPLB"),
])
def test_a_bad_pool_setting_is_one_line(item, message):
    with pytest.raises(PlannerError, match=message):
        Disaggregation(1, 1, prefill_set=parse_pool_set("prefill", [item])).pools(V1)


def test_a_pool_may_balance_its_experts_alone():
    moe = Deployment(model="qwen3-30b-a3b", gpu="h100-sxm", dp=2, enable_expert_parallel=True)
    pools = Disaggregation(1, 1, decode_set=parse_pool_set("decode", ["enable_eplb=true",
                                                                      "num_redundant_experts=2"]))
    prefill, decode = pools.pools(moe)
    assert (prefill.enable_eplb, decode.enable_eplb, decode.num_redundant_experts) == (False, True, 2)


def test_pools_run_their_own_all2all_backends(tmp_path):
    # vLLM's expert-parallel guide: prefill on DeepEP's normal kernels, decode on its low-latency ones
    result = CliRunner().invoke(app, ["simulate", "--model", "qwen3-30b-a3b", "--gpu", "h100-sxm", "--dp", "2",
                                      "--enable-expert-parallel", "--pd", "1:1",
                                      "--prefill-set", "all2all_backend=deepep_high_throughput",
                                      "--decode-set", "all2all_backend=deepep_low_latency",
                                      "--decode-set", "max_num_seqs=32", "--requests", "20", "--rate", "4",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    pd = json.loads((tmp_path / "result.json").read_text())["pd"]
    assert "deepep_high_throughput" in pd["prefill"]["cost_model"]
    assert "deepep_low_latency" in pd["decode"]["cost_model"]
    assert pd["decode"]["max_num_seqs"] == 32 and pd["prefill"]["max_num_seqs"] == 1024
    assert "--decode-set max_num_seqs=32" in result.output             # the next command keeps them


def test_a_pool_setting_needs_pd():
    result = CliRunner().invoke(app, ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                                      "--decode-set", "max_num_seqs=32", "--requests", "4"])
    assert result.exit_code != 0 and "--decode-set sets a pool of disaggregated prefill" in result.output


def test_capacity_of_pools_that_meet_nothing_suggests_a_replica_more_in_each_pool(tmp_path):
    """Not a run-wide --tp, which a pool's own --prefill-tp / --decode-tp would override."""
    result = runner.invoke(app, [str(a) for a in (
        "capacity", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--policy", "vllm-v1", "--pd", "1:1",
        "--decode-tp", 2, "--slo", "ttft_p99=0.0001", "--workload", "random", "-p", "input_len=500", "-p",
        "output_len=50", "--duration", 10, "--out", tmp_path / "c")])
    assert result.exit_code == 0, result.output
    nxt = next(line for line in result.output.splitlines() if "Next:" in line)
    assert "--pd 2:2 --decode-tp 2" in nxt and "--tp 2" not in nxt.replace("--decode-tp 2", "")


def test_a_prefill_replica_waits_for_the_blocks_it_lent_instead_of_stalling():
    """A prefill replica holds a handed-off request's blocks until the decode side reads them. With one
    decode replica behind nine prefill ones, the reads lag, and at the end of the arrivals a prefill replica
    had 27 prompts of 8,000 tokens waiting and 30,001 of its 30,354 blocks lent out: stop 70 found the run
    stopping there ('the scheduler stalled'), as if those blocks were gone. They come back as the decode
    replica reads them, and every request is served."""
    spec = RunSpec(deployment=Deployment(model="llama-3.1-70b", gpu="h100-sxm", tp=4, policy="vllm-v1",
                                         max_num_batched_tokens=2048, max_num_seqs=256,
                                         enable_prefix_caching=False),
                   load=Load(workload="random", params=(("input_len", 8000), ("output_len", 200)), rate=16.0,
                             duration=120.0),
                   pd=Disaggregation(9, 1))
    doc = Simulation.prepare(spec).run().document()
    assert doc["num_completed"] == doc["num_submitted"] > 1500
    assert doc["verdict"]["overloaded"]          # one decode replica cannot keep up with 16 req/s
