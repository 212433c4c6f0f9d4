"""`planner simulate` and `planner capacity` through the typer app."""
from __future__ import annotations

import csv
import json

import pytest
from typer.testing import CliRunner

from planner.cli.app import app
from planner.runs.slos import meets, parse_slos
from engine.deployment import Deployment
from planner.api import run_spec
from planner.sizing.capacity import find_capacity
from planner.errors import PlannerError

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_defaults_run_the_papers_setting(tmp_path):
    # The workload, block size and policy: opt-13b on one a100-40g, 1000 chatbot requests at 1 req/s.
    result = invoke("simulate", "--workload", "chatbot", "--block-size", 16, "--policy", "paper", "--out", tmp_path,
                    "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)            # exactly one JSON document on stdout
    for name in ("request_throughput", "output_token_throughput", "ttft_mean", "ttft_p99", "tpot_mean",
                 "e2e_mean", "normalized_latency", "mean_batch_size", "kv_utilization", "memory_breakdown",
                 "preemptions", "num_completed", "num_rejected", "sharing_saved", "cost_model"):
        assert name in doc
    assert doc["num_completed"] + doc["num_rejected"] == doc["num_submitted"] == 1000
    assert doc["params"]["model"] == "opt-13b" and doc["params"]["gpu"] == "a100-40g"
    assert doc["params"]["trace_params"]["rate"] == 1.0
    # NVIDIA's measured vLLM tables cover the A100 (40 GB: the 80 GB data with its slower memory)
    assert doc["cost_model"] == ("measured(a100-40g: a100_sxm vllm 0.14.0, aiconfigurator-core 0.12.0, "
                                 "memory-bound parts x1.31)")
    assert doc["memory_plan"]["num_gpu_blocks"] == doc["num_gpu_blocks"]
    for name in ("result.json", "requests.csv", "steps.csv", "latency_cdf.png", "timeline.png",
                 "memory_breakdown.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert json.loads((tmp_path / "result.json").read_text())["num_steps"] == doc["num_steps"]
    with (tmp_path / "steps.csv").open() as f:
        assert sum(1 for _ in f) == doc["num_steps"] + 1
    with (tmp_path / "requests.csv").open() as f:
        assert sum(1 for _ in f) == 1001


def test_table_output_names_the_cost_model_and_memory_plan(tmp_path):
    result = invoke("simulate", "--workload", "alpaca", "--requests", 50, "--rate", 5, "--out", tmp_path)
    assert result.exit_code == 0, result.output
    assert "memory plan" in result.stdout and "KV token slots" in result.stdout
    shown = " ".join(result.stdout.split())        # the title may wrap
    assert "measured(a100-40g: a100_sxm vllm 0.14.0" in shown and "normalized latency" in shown
    forced = invoke("simulate", "--workload", "alpaca", "--requests", 20, "--cost-model", "roofline", "--out", tmp_path)
    assert forced.exit_code == 0 and "roofline(a100-40g)" in forced.stdout


def test_h100_memory_plan_matches_vllm(tmp_path):
    # vLLM 0.19.0 allocated 476,016 KV tokens for Llama-3.1-8B on one H100 80GB at utilization 0.95 and its API
    # server's defaults there (8,192 batched tokens, 1,024 sequences; bench/data/vllm_memory_logs.json)
    result = invoke("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--policy", "vllm-v1",
                    "--gpu-memory-utilization", 0.95, "--max-model-len", 8192, "--requests", 5, "--workload", "alpaca",
                    "--out", tmp_path, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["memory_plan"]["kv_token_slots"] == pytest.approx(476_016, rel=0.01)
    assert doc["params"]["max_num_batched_tokens"] == 8192 and doc["params"]["max_num_seqs"] == 1024


@pytest.mark.parametrize("args, message", [
    (["--model", "gpt-17"], "unknown model"),
    (["--gpu", "z100"], "unknown GPU"),
    (["--workload", "nope"], "unknown workload"),
    (["--workload", "sharegtp"], "did you mean sharegpt"),
    (["--gpu", "a100-41g"], "did you mean a100-40g"),
    (["--model", "opt-13"], "did you mean opt-13b"),
    (["--gpu-memory-utilization", "0.64"], "vLLM refuses to start"),
    (["--model", "opt-66b"], "--tp 4 fits"),
    (["--tp", "3"], "valid: 1, 2, 4, 5, 8, 10, 20, 40"),
    (["--max-num-seqs", "4096"], "max_num_seqs"),
    (["--block-size", "12"], "block_size 12"),
    (["--rate", "-1"], "rate"),
    (["--duration", "0"], "trace is empty"),
    (["--concurrency", "4", "--duration", "60"], "a closed loop (--concurrency) sends each request when"),
    (["--model", "opt-66b"], "does not fit"),
    (["--allocator", "buddy"], "allocator"),
    (["--preemption", "drop"], "preemption"),
    (["--tp", "3"], "tensor parallel"),
    (["--trace", "missing.jsonl"], "no such file"),
    (["--trace", "."], ". is a folder; give a .jsonl or .csv trace file in it"),
    (["--model", "./no-such-folder"], "no such config file or model folder"),
    (["--cost-model", "magic"], "choose one of auto, calibrated, measured, roofline"),
    (["--cost-model", "measured", "--gpu", "l4", "--model", "opt-1.3b"],
     "no measured vLLM data for GPU l4; covered: a100-40g"),
    (["--max-num-batched-tokens", "1024", "--policy", "paper"], "use --policy vllm-v1 or --max-model-len 1024"),
    (["--max-model-len", "4096"], "greater than opt-13b's 2048 positions"),
    (["--swap-space", "nan"], "swap_space must be a number of GiB from 0 to 1,048,576, got nan"),
    (["--swap-space", "inf"], "swap_space must be a number of GiB from 0 to 1,048,576, got inf"),
    (["--max-num-seqs", "nan"], "--max-num-seqs: 'nan' is not a valid int"),
    # a tp of 1e11 was checked by counting to it
    (["--tp", "99999999999"], "tensor parallel size 99999999999 (--tp) does not split"),
    (["--seeds", "99999999999"], "--seeds must be 1 to 1,000, got 99999999999"),     # a list of 1e11 runs
    # an empty value is a mistake, not the default (stop 68)
    (["--replicas", "2", "--router", ""], "--router '': choose round-robin"),
    (["--cost-model", ""], "--cost-model '': choose one of auto"),
    (["--pd", "1:1", "--policy", "vllm-v1", "--kv-link", ""], "unknown KV link ''"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    result = invoke("simulate", "--requests", 5, "--out", tmp_path, *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.output


def test_a_run_folder_that_cannot_be_made_names_the_path(tmp_path):
    (tmp_path / "file").write_text("")
    result = invoke("simulate", "--requests", 5, "--out", tmp_path / "file" / "run")
    assert result.exit_code == 2
    # before the run, and no "[Errno 20]"
    run = tmp_path / "file" / "run"
    assert result.stderr.strip() == f"error: --out {run}: {run.parent} is a file, not a folder"


@pytest.mark.parametrize("command", [
    ["profile", "--gpu", "cpu", "--quick"],
    ["profile", "--speculative", "ngram:3", "--trace", "missing.jsonl"],
    ["validate", "--gpu", "cpu", "--quick"],                  # a report folder
    ["bench", "--endpoint", "http://127.0.0.1:1", "--workload", "sharegpt", "--requests", "2"],
])
def test_an_output_that_cannot_be_written_is_refused_before_the_work(tmp_path, command):
    # Minutes of profiling or a live run would otherwise be lost when their results are written.
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "sub" / "out"
    result = invoke(*command, "--out", out)
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: --out {out}: {tmp_path / 'file'} is a file, not a folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]        # nothing made on the way


def test_sweep_writes_a_comparison(tmp_path):
    result = invoke("simulate", "--workload", "sharegpt", "--requests", 40, "--rate", "2,8",
                    "--allocator", "paged,orca-max", "--policy", "paper", "--out", tmp_path, "--json")
    assert result.exit_code == 0, result.output
    runs = json.loads(result.stdout)["runs"]
    assert [(r["params"]["allocator"], r["params"]["trace_params"]["rate"]) for r in runs] == [
        ("paged", 2.0), ("paged", 8.0), ("orca-max", 2.0), ("orca-max", 8.0)]
    with (tmp_path / "comparison.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and {r["allocator"] for r in rows} == {"paged", "orca-max"}
    for name in ("metrics_vs_rate.png", "metrics_vs_allocator.png", "memory_breakdown.png", "sweep.json",
                 "report.html"):
        assert (tmp_path / name).stat().st_size > 0
    # Same trace per rate: paged batches at least as many requests as orca-max.
    by = {(r["params"]["allocator"], r["params"]["trace_params"]["rate"]): r for r in runs}
    assert by[("paged", 8.0)]["mean_batch_size"] >= by[("orca-max", 8.0)]["mean_batch_size"]


def test_block_size_sweep_runs_each_size(tmp_path):
    result = invoke("simulate", "--workload", "alpaca", "--requests", 30, "--rate", 4, "--block-size", "1,256",
                    "--out", tmp_path, "--json")
    assert result.exit_code == 0, result.output
    assert [r["params"]["block_size"] for r in json.loads(result.stdout)["runs"]] == [1, 256]


def test_slo_parsing():
    assert parse_slos(["0.2"]) == {"normalized_latency": 0.2}
    assert parse_slos(["ttft_p99=2", "tpot_p99=0.1"]) == {"ttft_p99": 2.0, "tpot_p99": 0.1}
    for bad in (["latency=1"], ["ttft_p99=x"], ["-1"], ["inf"], ["ttft_p99=1e400"], ["nan"], []):
        with pytest.raises(PlannerError):
            parse_slos(bad)
    assert not meets({"normalized_latency": 0.1, "num_rejected": 1}, {"normalized_latency": 0.2})
    assert meets({"normalized_latency": 0.1, "num_rejected": 0}, {"normalized_latency": 0.2})


def test_capacity_brackets_the_slo():
    spec = run_spec(Deployment(policy="paper"), workload="sharegpt", requests=150)   # the paper's SLO and policy
    slos = {"normalized_latency": 0.1}
    found = find_capacity(spec, slos, start=1.0, rel_tol=0.05)
    assert found.bounded and found.rate is not None
    ok = [p.rate for p in found.probes if p.ok]
    missed = [p.rate for p in found.probes if not p.ok]
    assert max(ok) == found.rate and found.doc["normalized_latency"] <= 0.1
    # The bracket closed within the tolerance just above the capacity.
    assert min(r for r in missed if r > found.rate) <= found.rate * 1.06
    # Orca-max reaches the same SLO only at a lower rate (the paper's Fig. 12 story).
    orca_spec = run_spec(Deployment(allocator="orca-max", policy="paper"), workload="sharegpt", requests=150)
    orca = find_capacity(orca_spec, slos, start=1.0, rel_tol=0.05)
    assert orca.rate is None or orca.rate < found.rate


def test_capacity_command(tmp_path):
    result = invoke("capacity", "--slo", "ttft_p99=5", "--workload", "alpaca", "--requests", 100,
                    "--tolerance", 0.1, "--out", tmp_path, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["capacity_rate"] > 0 and doc["at_capacity"]["ttft_p99"] <= 5
    assert (tmp_path / "capacity.json").is_file()
    bad = invoke("capacity", "--slo", "speed=3", "--out", tmp_path)
    assert bad.exit_code == 2 and "unknown metric" in bad.stderr
    burst = invoke("capacity", "--slo", "0.5", "--max-rate", "inf", "--out", tmp_path)   # was a TypeError
    assert burst.exit_code == 2 and "<= max rate (inf), all finite" in burst.stderr


def test_an_output_folder_that_cannot_take_the_run_is_refused_before_the_run(tmp_path):
    """--out "" (the current folder) and --out naming a file: one line, before any work (stop 68: the run was
    done first, then lost; search died with a traceback after its first configuration)."""
    taken = tmp_path / "a-file"
    taken.write_text("keep me")
    for command in (["simulate", "--requests", "4"], ["capacity", "--requests", "4", "--slo", "ttft_p99=1"],
                    ["search", "--requests", "4", "--slo", "ttft_p99=1", "--rate", "1"]):
        for out, message in (("", "not the current one"), (str(taken), "is a file, not a folder")):
            result = CliRunner().invoke(app, [*command, "--model", "opt-125m", "--gpu", "h100-sxm", "--out", out])
            assert result.exit_code == 2 and message in result.output and "searching" not in result.output, \
                (command, out, result.output)
    assert taken.read_text() == "keep me"


def test_the_planner_command_says_a_bad_option_in_one_line():
    """Through the `planner` entry point (main): click's usage block was four lines."""
    import subprocess
    import sys

    def planner(*args):
        return subprocess.run([sys.executable, "-c", "from planner.cli.app import main; main()", *args],
                              capture_output=True, text=True, timeout=120)
    for args, message in ((["simulate", "--requests", "abc"], "Invalid value for '--requests'"),
                          (["simulate", "--bogus", "3"], "No such option: --bogus"),
                          (["nosuchcommand"], "No such command 'nosuchcommand'")):
        done = planner(*args)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    alone = planner()
    assert alone.returncode == 0 and "Capacity planner for LLM serving" in alone.stdout     # alone: its help
    assert planner("simulate", "--help").returncode == 0
