"""`planner search`: prices, ranking, the Pareto front, executors that agree, and the CLI."""
from __future__ import annotations

import csv
import io
import json
import re

import pytest
from typer.testing import CliRunner

from planner.cli.app import app
from planner.errors import PlannerError
from planner.sizing import SearchGrid, load_prices, make_executor, parse_price_overrides, run_search
from planner.runs.pools import LocalExecutor
from planner.sizing.prices import price_table
from planner.sizing.search import ConfigTask, choose_best, evaluate, pareto_front
from planner.sizing.capacity import find_capacity
from sim_helpers import search_grid

SLOS = {"ttft_p99": 2.0, "tpot_p99": 0.1}


def small_grid(**changes) -> SearchGrid:
    base = dict(model="opt-125m", workload="alpaca", slos=SLOS, gpus=("a100-80g", "h100-sxm"), tps=(1,),
                block_sizes=(16,), max_num_seqs=(2, 32), target_rate=4.0, duration=None, requests=60,
                tolerance=0.1, max_rate=64.0)
    return search_grid(**{**base, **changes})


def test_every_catalog_price_has_a_source_and_a_date():
    prices = load_prices()
    assert {"a100-40g", "a100-80g", "h100-sxm"} <= set(prices)
    for p in prices.values():
        assert p.usd_per_gpu_hour > 0
        if p.verified:      # a source to check, with the date it was read
            assert "https://" in p.source and re.fullmatch(r"\d{4}-\d{2}-\d{2}", p.date), p
        else:
            assert p.source.startswith("unverified") and p.date == "unverified", p


def test_every_catalog_gpu_is_priced_or_says_why_not():
    from planner.catalog.gpus import list_gpus
    from planner.sizing.prices import unpriced
    missing = {g.name for g in list_gpus()} - {"cpu"} - set(load_prices())
    assert missing == set(unpriced())
    with pytest.raises(PlannerError, match="b200.*Capacity Blocks.*--price b200="):
        price_table(["b200"], {})


def test_price_overrides():
    assert parse_price_overrides(["h100-sxm=2.49", "a100-80g=$1.79,l4=0.5"]) == {
        "h100-sxm": 2.49, "a100-80g": 1.79, "l4": 0.5}
    for bad in ("h100-sxm", "h100-sxm=cheap", "=2", "h100-sxm=-1"):
        with pytest.raises(PlannerError, match="--price"):
            parse_price_overrides([bad])
    table = price_table(["h100-sxm", "a100-80g"], {"h100-sxm": 2.49})
    assert table["h100-sxm"].usd_per_gpu_hour == 2.49 and table["h100-sxm"].source == "--price"
    assert table["a100-80g"].date
    with pytest.raises(PlannerError, match="no price for GPU 'cpu'"):
        price_table(["cpu"], {})
    with pytest.raises(PlannerError, match="not among --gpus"):
        price_table(["h100-sxm"], {"l4": 1.0})
    assert parse_price_overrides(["a100=1.5,H100=2"]) == {"a100-40g": 1.5, "h100-sxm": 2.0}   # catalog names


def test_cli_takes_gpu_aliases_as_simulate_does(tmp_path):
    """`--gpus a100` is the catalog's a100-40g, priced under that name (it failed for want of a price)."""
    result = CliRunner().invoke(app, ["search", "--model", "opt-125m", "--workload", "alpaca", "--requests", "30",
                                      "--slo", "ttft_p99=2", "--gpus", "a100,a100-40g", "--tp", "1", "--rate", "2",
                                      "--tolerance", "0.5", "--workers", "1", "--price", "a100=1.5",
                                      "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    configs = json.loads(result.stdout)["configs"]
    assert [c["gpu"] for c in configs] == ["a100-40g"] and configs[0]["cost_per_hour"] == 1.5


def _row(gpu, capacity, cost):
    return {"gpu": gpu, "capacity": capacity, "cost_per_hour": cost,
            "capacity_per_dollar": None if capacity is None else capacity / cost}


def test_best_and_pareto_front():
    rows = [_row("a", 3.0, 4.0), _row("b", 5.0, 4.0), _row("c", 4.0, 6.0), _row("d", 9.0, 8.0),
            _row("e", None, 1.0), _row("f", 12.0, 16.0)]
    assert [r["gpu"] for r in pareto_front(rows)] == ["b", "d", "f"]
    assert choose_best(rows, 4.5)["gpu"] == "b"          # cheapest reaching the rate
    assert choose_best(rows, 8.5)["gpu"] == "d"
    assert choose_best(rows, 20.0) is None
    assert choose_best(rows, None)["gpu"] == "b"         # max: most capacity per dollar (1.25 req/s per $/h)


def test_search_with_the_local_executor():
    grid = small_grid()
    serial = run_search(grid, LocalExecutor(1), prices={"h100-sxm": 2.0})
    pooled = run_search(grid, make_executor("local", workers=2), prices={"h100-sxm": 2.0})
    assert serial.configs == pooled.configs                      # the process pool changes nothing
    rows = {(r["gpu"], r["max_num_seqs"]): r for r in serial.configs}
    assert len(rows) == 4
    # Each row is the capacity search `planner capacity` runs for that configuration.
    task = ConfigTask(grid, "a100-80g", 1, 16, 32)
    direct = find_capacity(task.spec(), SLOS, start=4.0, min_rate=0.01, max_rate=64.0, rel_tol=0.1)
    assert rows[("a100-80g", 32)]["capacity"] == direct.rate == evaluate(task)["capacity"]
    assert rows[("h100-sxm", 32)]["cost_per_hour"] == 2.0
    assert rows[("a100-80g", 2)]["capacity"] < rows[("a100-80g", 32)]["capacity"]   # 2 sequences per step: less
    best = serial.best
    assert best["capacity"] >= 4.0
    assert best["cost_per_hour"] == min(r["cost_per_hour"] for r in serial.configs if r["capacity"] >= 4.0)
    doc = json.loads(json.dumps(serial.document()))
    assert set(doc["best"]) == {"gpu", "tp", "block_size", "max_num_seqs", "capacity", "cost_per_hour"}
    assert len(doc["configs"]) == 4 and "https://" in doc["prices"]["a100-80g"]["source"]
    table = list(csv.DictReader(io.StringIO(serial.csv_text())))
    assert len(table) == 4 and {"capacity", "cost_per_hour", "pareto"} <= set(table[0])


def test_a_configuration_that_cannot_run_is_listed_with_the_reason():
    row = evaluate(ConfigTask(small_grid(model="opt-66b"), "a100-80g", 1, 16, 32))
    assert row["capacity"] is None and row["note"]


def test_a_search_whose_every_configuration_is_refused_says_so_and_exits_2(tmp_path):
    # no GPU of the search holds the model: a refusal (exit 2, its reason), not "none reaches the rate"
    args = ["search", "--model", "llama-3.1-405b", "--gpus", "l4,a10g", "--slo", "ttft_p99=1", "--requests", "10"]
    for flags in ((), ("--json",), ("--replicas", "auto", "--rate", "5")):
        result = CliRunner().invoke(app, [*args, *flags, "--out", str(tmp_path / "-".join(flags))])
        assert result.exit_code == 2, result.output
        assert result.stderr.splitlines()[-1].startswith("error: no configuration could run: all 6 were refused "
                                                         "(l4 x1: model llama-3.1-405b does not fit on 1 x l4")
        assert "No configuration" not in result.stdout
        assert (tmp_path / "-".join(flags) / "search.json").is_file()      # the rows, each with its reason
    # one configuration that runs: the others' refusals are its rows' notes, the search answers as before
    mixed = CliRunner().invoke(app, ["search", "--model", "opt-125m", "--gpus", "a100-80g", "--tp", "1,5",
                                     "--slo", "ttft_p99=2", "--requests", "20", "--max-rate", "4", "--json",
                                     "--out", str(tmp_path / "mixed")])
    assert mixed.exit_code == 0, mixed.output
    notes = [c["note"] for c in json.loads(mixed.stdout)["configs"]]
    assert len(notes) == 2 and any("tensor parallel size 5" in note for note in notes)


def test_cli_json_and_files(tmp_path):
    result = CliRunner().invoke(app, ["search", "--model", "opt-125m", "--workload", "alpaca", "--requests", "40",
                                      "--slo", "ttft_p99=2,tpot_p99=0.1", "--gpus", "a100-80g,h100-sxm",
                                      "--tp", "1", "--max-num-seqs", "32", "--rate", "max", "--tolerance", "0.2",
                                      "--workers", "1", "--price", "h100-sxm=2.5", "--out", str(tmp_path),
                                      "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["target_rate"] == "max" and doc["best"]["gpu"] in ("a100-80g", "h100-sxm")
    assert {c["gpu"] for c in doc["configs"]} == {"a100-80g", "h100-sxm"}
    assert (tmp_path / "pareto.png").stat().st_size > 0 and (tmp_path / "configs.csv").is_file()


def test_cli_searches_each_gpus_own_max_num_seqs_by_default(tmp_path):
    """Without --max-num-seqs each GPU gets vllm-v1's own default, as `vllm serve` would run it (vLLM's
    EngineArgs.get_batch_defaults): 1024 sequences on an H100, 256 on an A100; the rows say which."""
    result = CliRunner().invoke(app, ["search", "--model", "opt-125m", "--workload", "alpaca", "--requests", "40",
                                      "--slo", "ttft_p99=2,tpot_p99=0.1", "--gpus", "a100-80g,h100-sxm",
                                      "--tp", "1", "--rate", "4", "--tolerance", "0.3", "--workers", "1",
                                      "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert {c["gpu"]: c["max_num_seqs"] for c in doc["configs"]} == {"a100-80g": 256, "h100-sxm": 1024}
    assert all("resolved_max_num_seqs" not in c for c in doc["configs"])


@pytest.mark.parametrize("args,message", [
    (["--rate", "fast"], "--rate"), (["--tp", "one"], "--tp"), (["--gpus", "a100-80g", "--price", "l4=1"], "--gpus"),
    (["--executor", "spark"], "unknown executor"), (["--slo", "ttft_p42=1"], "unknown metric"),
    (["--slo", "tpot=0.05"], "say which statistic: tpot_mean, tpot_median, tpot_p90, tpot_p95, tpot_p99"),
    (["--ray-address", "auto"], "--executor ray"),
    (["--tp", "0"], "tp must be >= 1"), (["--block-size", "7"], "block_size 7"), (["--gpus", "z100"], "unknown GPU"),
    (["--gpus", "a100-80g", "--price", "z100=1"], "unknown GPU"),
])
def test_cli_bad_input_is_one_line(args, message, tmp_path):
    base = ["search", "--model", "opt-125m", "--requests", "10", "--out", str(tmp_path / "run")]
    if "--slo" not in args:
        base += ["--slo", "ttft_p99=2"]
    result = CliRunner().invoke(app, base + args)
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    if "--slo" in args:                  # refused before the search announces itself
        assert "searching" not in result.output
    assert not (tmp_path / "run").exists()          # refused before its run folder is made


def test_progress_keeps_each_finished_row_and_makes_its_folder_with_the_first(tmp_path):
    from rich.console import Console
    from planner.cli.search import SearchProgress
    folder = tmp_path / "run"
    progress = SearchProgress(Console(file=io.StringIO()), folder)
    assert not folder.exists()                      # nothing ran yet: nothing written
    row = {"gpu": "h100-sxm", "tp": 2, "block_size": 16, "max_num_seqs": None, "capacity": 3.5, "first_miss": 4.0,
           "bounded": True, "probes": 5, "note": "a, b"}
    progress(row, 1, 2)
    progress(dict(row, tp=4, capacity=None, note="does not fit"), 2, 2)
    rows = list(csv.DictReader((folder / "configs.partial.csv").open()))
    assert [(r["tp"], r["capacity"], r["note"]) for r in rows] == [("2", "3.5", "a; b"), ("4", "", "does not fit")]
    (folder / "configs.partial.csv").write_text("stale\n")   # an earlier search's leftovers in the same folder
    again = SearchProgress(Console(file=io.StringIO()), folder)
    again(row, 1, 1)
    assert len(list(csv.DictReader((folder / "configs.partial.csv").open()))) == 1


@pytest.mark.slow
def test_ray_executor_gives_the_local_results():
    pytest.importorskip("ray")
    grid = small_grid()
    local = run_search(grid, make_executor("local", workers=2))
    ray_executor = make_executor("ray", workers=2)
    try:
        on_ray = run_search(grid, ray_executor)
    finally:
        ray_executor.close()
    assert on_ray.executor == "ray"
    assert on_ray.configs == local.configs and on_ray.best == local.best


@pytest.mark.parametrize("args, message", [
    (["--rate", "1", "--concurrency", "4"], "give --rate or --concurrency, not both"),
    (["--workers", "0"], "--workers must be >= 1"),
    (["--price", "h100-sxm=inf"], "--price 'h100-sxm=inf'"),
])
def test_search_refuses_values_that_make_no_search(tmp_path, args, message):
    result = CliRunner().invoke(app, ["search", "--model", "opt-125m", "--gpu", "h100-sxm", "--requests", "4",
                                      "--slo", "ttft_p99=1", "--out", str(tmp_path / "s"), *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_a_linear_cost_model_needs_finite_prices():
    from planner.cost.linear import parse_linear
    for text in ("linear:nan,0", "linear:inf,0", "linear:0,inf"):
        with pytest.raises(PlannerError, match="must be finite"):
            parse_linear(text)


def test_a_capacity_search_does_not_double_its_way_to_any_rate():
    from planner.sizing.bracket import check_rates
    with pytest.raises(PlannerError, match="give at most 1,000,000"):
        check_rates(1.0, 0.1, 1e308, 0.02)
    check_rates(1.0, 0.1, 1e6, 0.02)
