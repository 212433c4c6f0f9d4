"""`planner search` over fleets (issue 25, item 4): replicas x TP x GPU, the cheapest fleet meeting the SLOs."""
from __future__ import annotations

import csv
import io
import json

import pytest
from typer.testing import CliRunner

from engine.deployment import Deployment
from planner.cli.app import app
from planner.errors import PlannerError
from planner.runs.pipeline import Simulation
from planner.runs.pools import LocalExecutor
from planner.runs.spec import Load, RunSpec
from planner.sizing.probe import Prober
from planner.sizing.search import SearchGrid, family_waves, hint_parent, run_search

SLOS = {"ttft_p99": 2.0, "tpot_p99": 0.2}
PRICES = {"a100-80g": 3.0, "l40s": 1.4}        # fixed, so the ranking does not follow the price list


def grid(**changes) -> SearchGrid:
    spec = RunSpec(deployment=Deployment(model="opt-6.7b", gpu="a100-80g", policy="paper"),   # its figures' scheduler
                   load=Load(workload="sharegpt", requests=80))
    settings = dict(base=spec, slos=SLOS, gpus=("a100-80g", "l40s"), tps=(1,), target_rate=6.0,
                    tolerance=0.1, replicas=(1, 2))
    settings.update(changes)
    return SearchGrid(**settings)


def full_probe(g: SearchGrid, gpu: str, replicas: int, rate: float):
    """A fleet simulated to the end (no early stop), judged as the search judges its probes."""
    spec = g.base.with_deployment(gpu=gpu).with_fleet(replicas=replicas)
    return Prober(Simulation.prepare(spec), g.slos, early_stop=False)(rate)


def test_a_fleet_meets_what_one_replica_misses_and_the_cheaper_fleet_wins():
    g = grid()
    result = run_search(g, LocalExecutor(1), prices=PRICES)
    rows = {(r["gpu"], r["replicas"]): r for r in result.configs}
    assert set(rows) == {("a100-80g", 1), ("a100-80g", 2), ("l40s", 1), ("l40s", 2)}
    # One L40S misses 6 req/s, two serve them; so does one A100.
    assert not rows["l40s", 1]["meets_target"] and rows["l40s", 2]["meets_target"]
    assert rows["a100-80g", 1]["meets_target"] and rows["a100-80g", 2]["meets_target"]
    assert not full_probe(g, "l40s", 1, 6.0).ok and full_probe(g, "l40s", 2, 6.0).ok
    # A fleet costs replicas x TP x $/GPU-hour; the cheapest feasible fleet is the answer.
    assert rows["l40s", 2]["cost_per_hour"] == pytest.approx(2 * 1.4)
    assert rows["a100-80g", 1]["cost_per_hour"] == pytest.approx(3.0)
    assert (result.best["gpu"], result.best["replicas"]) == ("l40s", 2)
    assert result.document()["best"]["replicas"] == 2 and result.document()["replicas"] == [1, 2]
    # Two replicas serve about twice what one does.
    assert rows["l40s", 2]["capacity"] > 1.5 * rows["l40s", 1]["capacity"]


def test_replicas_are_an_axis_of_the_waves_and_hints():
    g = grid(tps=(1, 2), replicas=(1, 2, 4))
    assert hint_parent(g, ("a100-80g", 1, 256, 1)) is None
    assert hint_parent(g, ("a100-80g", 1, 256, 4)) == ("a100-80g", 1, 256, 2)
    assert hint_parent(g, ("a100-80g", 2, 256, 4)) == ("a100-80g", 1, 256, 4)
    waves = family_waves(g)
    assert sum(len(w) for w in waves) == 2 * 2 * 3
    assert {(f.gpu, f.tp, f.replicas) for f in waves[0]} == {("a100-80g", 1, 1), ("l40s", 1, 1)}


def test_replicas_auto_finds_the_fewest_and_one_fewer_misses():
    spec = RunSpec(deployment=Deployment(model="opt-6.7b", gpu="a100-80g"),
                   load=Load(workload="sharegpt", requests=200))
    g = SearchGrid(base=spec, slos=SLOS, gpus=("a100-80g",), target_rate=40.0, replicas="auto")
    result = run_search(g, LocalExecutor(1), prices={"a100-80g": 3.0})
    (row,) = result.configs
    k = row["replicas"]
    assert k is not None and k >= 2 and row["missed_at_replicas"] == k - 1
    assert result.best is row and row["cost_per_hour"] == pytest.approx(3.0 * k)
    assert 0 < row["slo_use"] <= 1
    # Simulated to the end, without the search's early stops: K meets the SLOs, K - 1 misses them.
    assert full_probe(g, "a100-80g", k, 40.0).ok
    assert not full_probe(g, "a100-80g", k - 1, 40.0).ok


def test_cli_fleet_outputs_carry_replicas(tmp_path):
    result = CliRunner().invoke(app, ["search", "--model", "opt-6.7b", "--gpus", "a100-80g,l40s", "--tp", "1",
                                      "--requests", "80", "--slo", "ttft_p99=2,tpot_p99=0.2", "--tolerance", "0.1",
                                      "--rate", "6", "--replicas", "1,2", "--router", "least-requests",
                                      "--price", "a100-80g=3", "--price", "l40s=1.4", "--workers", "1",
                                      "--policy", "paper", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["router"] == "least-requests" and doc["replicas"] == [1, 2]
    assert doc["best"]["replicas"] == 2 and doc["best"]["gpu"] == "l40s"
    assert sorted(c["replicas"] for c in doc["configs"]) == [1, 1, 2, 2]
    table = list(csv.DictReader(io.StringIO((tmp_path / "configs.csv").read_text())))
    assert [r["replicas"] for r in table] == ["1", "2", "1", "2"]
    assert json.loads((tmp_path / "search.json").read_text())["best"]["replicas"] == 2
    assert (tmp_path / "pareto.png").stat().st_size > 0


def test_cli_replicas_auto_writes_the_count(tmp_path):
    result = CliRunner().invoke(app, ["search", "--model", "opt-6.7b", "--gpus", "a100-80g", "--tp", "1",
                                      "--requests", "200", "--slo", "ttft_p99=2,tpot_p99=0.2", "--rate", "40",
                                      "--replicas", "auto", "--workers", "1", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "Best (cheapest fleet serving 40 req/s)" in result.stdout
    (row,) = csv.DictReader(io.StringIO((tmp_path / "configs.csv").read_text()))
    assert int(row["replicas"]) >= 2 and int(row["missed_at_replicas"]) == int(row["replicas"]) - 1
    doc = json.loads((tmp_path / "search.json").read_text())
    assert doc["replicas"] == "auto" and doc["best"]["replicas"] == int(row["replicas"])
    assert (tmp_path / "pareto.png").stat().st_size > 0


@pytest.mark.parametrize("args,message", [
    (["--replicas", "0"], "--replicas"), (["--replicas", "two"], "--replicas"), (["--replicas", "1,-2"], "--replicas"),
    (["--replicas", "auto"], "--replicas auto"),                                # --rate max
    (["--replicas", "auto", "--concurrency", "4"], "--replicas auto"),
    (["--replicas", "auto", "--rate", "5", "--max-replicas", "0"], "--max-replicas"),
    (["--replicas", "2", "--router", "fastest"], "router"),
    (["--replicas", "2", "--router", "prefix-aware", "--policy", "paper"], "--enable-prefix-caching"),
    (["--router", "least-requests"], "--replicas"),
])
def test_cli_bad_fleet_values_are_one_line(args, message, tmp_path):
    base = ["search", "--model", "opt-125m", "--requests", "10", "--slo", "ttft_p99=2", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, base + args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_a_grid_with_bad_replicas_is_refused():
    with pytest.raises(PlannerError, match="--replicas"):
        run_search(grid(replicas=(0,)), LocalExecutor(1))
    with pytest.raises(PlannerError, match="--replicas auto"):
        run_search(grid(replicas="auto", target_rate=None), LocalExecutor(1))


def test_worker_processes_and_ray_give_the_same_fleets():
    """The tasks cross process boundaries (pickled) as Ray's would, and give the serial results."""
    g = grid(gpus=("a100-80g",), replicas=(1, 2))
    serial = run_search(g, LocalExecutor(1), prices={"a100-80g": 3.0})
    parallel = run_search(g, LocalExecutor(2), prices={"a100-80g": 3.0})
    assert parallel.configs == serial.configs and parallel.best == serial.best
    # (10 req/s: fleets of 2 and 3 replicas, each found past a fleet one smaller that misses)
    auto = SearchGrid(base=g.base, slos=SLOS, gpus=("a100-80g", "l40s"), target_rate=10.0, replicas="auto")
    assert run_search(auto, LocalExecutor(2)).configs == run_search(auto, LocalExecutor(1)).configs
    pytest.importorskip("ray")
    from planner.runs.pools import make_executor
    on_ray = make_executor("ray", workers=2)
    try:
        ray_result = run_search(auto, on_ray)
    finally:
        on_ray.close()
    assert ray_result.executor == "ray" and ray_result.configs == run_search(auto, LocalExecutor(1)).configs


def test_one_replica_is_the_search_without_fleets():
    g = grid(tps=(1, 2))
    lone = run_search(grid(replicas=None), LocalExecutor(1), prices=PRICES)
    fleet = run_search(grid(replicas=(1,)), LocalExecutor(1), prices=PRICES)
    assert "replicas" not in lone.configs[0] and "replicas" not in lone.document()
    assert [{k: v for k, v in r.items() if k != "replicas"} for r in fleet.configs] == lone.configs
    assert g.configs()[0] == ("a100-80g", 1, 16, 256, 1)


def test_a_fleet_search_of_dp_ranks_says_its_layout_and_its_fleets_router(tmp_path):
    """Each row and the best name the layout (their cost is 2 replicas x dp 2 GPUs), and the router is the
    fleets' (round-robin), not the vllm-dp balancer a lone deployment of dp ranks runs (stop 69)."""
    out = tmp_path / "s"
    result = CliRunner().invoke(app, [str(a) for a in (
        "search", "--model", "qwen3-30b-a3b", "--gpu", "h100-sxm", "--tp", 1, "--dp", 2, "--enable-expert-parallel",
        "--replicas", 2, "--slo", "tpot_p99=0.05", "--rate", 20, "--duration", 20, "--max-rate", 24, "--tolerance", 0.5,
        "--out", out)])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "search.json").read_text())
    assert doc["router"] == "round-robin"
    assert doc["best"]["dp"] == 2 and doc["best"]["enable_expert_parallel"] is True and doc["best"]["replicas"] == 2
    header = (out / "configs.csv").read_text().splitlines()[0].split(",")
    assert header[:4] == ["gpu", "tp", "dp", "enable_expert_parallel"]
    assert "2 x (h100-sxm x1 dp2 EP)" in result.output
