"""planner search over a MoE's dp / expert-parallel layouts (planner/sizing/layouts.py)."""

import json

from typer.testing import CliRunner

from planner.cli.app import app
from planner.sizing.layouts import layouts_for, merge
from planner.sizing.search import SearchResult


def test_layouts_try_ep_only_for_moe_and_more_than_one_gpu():
    assert layouts_for("qwen3-30b-a3b", (1, 2), (1, 2)) == [(1, False), (1, True), (2, False), (2, True)]
    assert layouts_for("qwen3-30b-a3b", (1,), (1,)) == [(1, False)]
    assert layouts_for("llama-3.1-8b", (1, 2), (1, 2)) == [(1, False), (2, False)]
    assert layouts_for("qwen3-30b-a3b", (2,), (1,), (True,)) == [(2, True)]


class _Grid:
    target_rate = None


def _result(rows):
    return SearchResult(_Grid(), rows, None, {}, "local")


def _row(tp, capacity, cost):
    return {"gpu": "h100-sxm", "tp": tp, "block_size": 16, "max_num_seqs": 256, "capacity": capacity,
            "cost_per_hour": cost, "capacity_per_dollar": capacity / cost, "note": "", "pareto": False}


def test_merge_tags_the_layouts_and_picks_the_best_over_them():
    plain = _result([_row(1, 10.0, 5.0), _row(2, 12.0, 10.0)])
    ep = _result([_row(1, 10.0, 5.0), _row(2, 30.0, 10.0)])
    dp2 = _result([_row(1, 25.0, 10.0)])                 # each layout's search priced its tp x dp GPUs
    merged = merge([((1, False), plain), ((1, True), ep), ((2, True), dp2)])
    assert len(merged.configs) == 4                      # EP on one GPU is the plain row: dropped
    dp_row = next(r for r in merged.configs if r["dp"] == 2)
    assert dp_row["cost_per_hour"] == 10.0 and dp_row["capacity_per_dollar"] == 2.5
    assert merged.best["enable_expert_parallel"] and merged.best["tp"] == 2 and merged.best["capacity"] == 30.0
    assert "dp" in merged.columns() and "enable_expert_parallel" in merged.csv_text().splitlines()[0]


def test_cli_search_explores_the_layouts(tmp_path):
    result = CliRunner().invoke(app, ["search", "--model", "qwen3-30b-a3b", "--gpu", "h100-sxm", "--tp", "1",
                                      "--dp", "1,2", "--policy", "vllm-v1", "--max-model-len", "2048",
                                      "--workload", "fixed", "-p", "prompt_len=256", "-p", "output_len=32",
                                      "--slo", "ttft_p99=1,tpot_p99=0.05", "--requests", "60", "--max-rate", "64",
                                      "--workers", "1", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output.strip().splitlines()[-1])
    layouts = {(r["dp"], r["enable_expert_parallel"]) for r in doc["configs"]}
    assert layouts == {(1, False), (2, False), (2, True)}
    assert {(x["dp"], x["enable_expert_parallel"]) for x in doc["layouts"]} == layouts   # EP on one GPU: not tried
    costs = {r["dp"]: r["cost_per_hour"] for r in doc["configs"]}
    assert costs[2] == 2 * costs[1]


def test_one_data_parallel_layout_costs_its_tp_x_dp_gpus(tmp_path):
    # a search of one dp 2 layout used to price its rows at tp GPUs, half the deployment
    args = ["search", "--model", "qwen3-30b-a3b", "--gpu", "h100-sxm", "--tp", "1", "--enable-expert-parallel",
            "--max-model-len", "2048", "--workload", "fixed", "-p", "prompt_len=256", "-p", "output_len=32",
            "--slo", "ttft_p99=1", "--requests", "40", "--max-rate", "32", "--workers", "1", "--json"]
    costs = {}
    for dp in (2, 4):
        result = CliRunner().invoke(app, args + ["--dp", str(dp), "--out", str(tmp_path / str(dp))])
        assert result.exit_code == 0, result.output
        row, = json.loads(result.output.strip().splitlines()[-1])["configs"]
        assert (row["dp"], row["enable_expert_parallel"]) == (dp, True)
        costs[dp] = row["cost_per_hour"]
    assert costs[2] == 2 * 6.88 and costs[4] == 4 * 6.88        # planner/data/prices.json: $6.88 per H100-hour
