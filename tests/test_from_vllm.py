"""`planner from-vllm`: an operator's `vllm serve` and `vllm bench serve` command lines as the planner's."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner.cli import app
from planner.errors import PlannerError
from planner.cli.from_vllm import BENCH_LOAD, SERVE_RENAMED, SERVE_SWITCHES, SERVE_VALUED, translate

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_public_qwen3_8b.py"
SERVE = ("vllm serve Qwen/Qwen3-8B --host 0.0.0.0 --port 8000 --dtype auto --gpu-memory-utilization 0.95 "
         "--max-model-len 8128")
LOAD = ("vllm bench serve --backend openai-chat --model Qwen/Qwen3-8B --endpoint /v1/chat/completions "
        "--dataset-name random --random-input-len 512 --random-output-len 256 --num-prompts 1024 "
        "--request-rate 25 --max-concurrency 96 --ignore-eos")


def test_a_public_runs_commands_become_one_simulate_line():
    t = translate(SERVE, LOAD, "h100-sxm")
    assert t.command == ("planner simulate --model Qwen/Qwen3-8B --gpu h100-sxm --dtype auto "
                         "--gpu-memory-utilization 0.95 --max-model-len 8128 --workload random -p input_len=512 "
                         "-p output_len=256 --rate 25 --requests 1024 --concurrency 96 --client-turnaround 0.001")
    assert t.ignored == ["--host", "--port", "--ignore-eos", "--backend", "--model", "--endpoint"]
    assert t.not_modelled == []


def test_vllms_spellings_and_configs_map_to_the_planners_flags():
    t = translate("python -m vllm.entrypoints.openai.api_server --model deepseek-ai/DeepSeek-R1 -tp=8 "
                  "--data_parallel_size 2 --enable-expert-parallel --num-gpu-blocks-override 9000 "
                  "--kv-cache-memory 123456789 --eplb-config '{\"num_redundant_experts\": 32}' --enable-eplb "
                  "--speculative-config '{\"method\": \"deepseek_mtp\", \"num_speculative_tokens\": 1}' "
                  "--no-enable-prefix-caching --enforce-eager", None, "h200")
    assert t.words == ["--model", "deepseek-ai/DeepSeek-R1", "--gpu", "h200", "--tp", "8", "--dp", "2",
                       "--enable-expert-parallel", "--num-gpu-blocks", "9000", "--kv-cache-memory-bytes", "123456789",
                       "--num-redundant-experts", "32", "--enable-eplb", "--speculative", "mtp:1",
                       "--no-enable-prefix-caching"]
    assert t.not_modelled == ["--enforce-eager"]
    eagle = translate("vllm serve m --speculative-config '{\"method\": \"eagle3\", \"num_speculative_tokens\": 3, "
                      "\"model\": \"h\"}'", None, "h100-sxm")
    assert eagle.words[-2:] == ["--speculative", "eagle:3"]
    draft = translate("vllm serve m --speculative-config '{\"model\": \"small\", \"num_speculative_tokens\": 4}'",
                      None, "h100-sxm")
    assert draft.words[-4:] == ["--speculative", "draft:4", "--draft-model", "small"]


def test_cpu_kv_offloading_carries_over():
    # vLLM's --kv-offloading-size (underscores too, as its argparse takes them) and --kv-offloading-backend
    t = translate("vllm serve m --kv_offloading_size 64 --kv-offloading-backend native", None, "h100-sxm")
    assert t.words[-4:] == ["--kv-offloading-size", "64", "--kv-offloading-backend", "native"]
    assert t.not_modelled == []


def test_the_offloading_connectors_json_carries_over_and_other_connectors_are_left_out():
    t = translate("vllm serve m --kv-transfer-config '{\"kv_connector\": \"OffloadingConnector\", "
                  "\"kv_role\": \"kv_both\", \"kv_connector_extra_config\": {\"cpu_bytes_to_use\": 34359738368}}'",
                  None, "h100-sxm")
    assert t.words[-2:] == ["--kv-offloading-size", "32"]
    assert t.not_modelled == []
    blocked = translate("vllm serve m --kv-transfer-config '{\"kv_connector\": \"OffloadingConnector\", "
                        "\"kv_connector_extra_config\": {\"block_size\": 64, \"cpu_bytes_to_use\": 1073741824}}'",
                        None, "h100-sxm")
    assert blocked.words[-2:] == ["--kv-offloading-size", "1"]
    assert blocked.not_modelled == ["--kv-transfer-config's block_size"]
    lmcache = translate("vllm serve m --kv-transfer-config '{\"kv_connector\": \"LMCacheConnectorV1\"}'", None,
                        "h100-sxm")
    assert lmcache.not_modelled == ["--kv-transfer-config"]
    with pytest.raises(PlannerError, match="cpu_bytes_to_use"):
        translate("vllm serve m --kv-transfer-config '{\"kv_connector\": \"OffloadingConnector\", "
                  "\"kv_connector_extra_config\": {\"num_cpu_blocks\": 1000}}'", None, "h100-sxm")


def test_vllm_benchs_defaults_and_its_other_loads():
    # the random dataset, 1,000 prompts, every one at once (vllm/benchmarks/datasets/arg_utils.py, serve.py)
    t = translate("vllm serve m", "vllm bench serve --model m", "h100-sxm")
    assert t.words[4:] == ["--workload", "random", "--rate", "inf", "--requests", "1000"]
    assert t.not_modelled == ["no --ignore-eos (vLLM's outputs end at EOS; the planner generates each request's "
                              "whole output length)"]
    closed = translate("vllm serve m", "vllm bench serve --max-concurrency 32 --ignore-eos "
                       "--goodput ttft:2000 tpot:50 e2el:30000 --seed 7", "h100-sxm")
    assert closed.words[4:] == ["--workload", "random", "--requests", "1000", "--concurrency", "32", "--seed", "7",
                                "--client-turnaround", "0.001", "--slo", "ttft_p99=2,tpot_p99=0.05,e2e_p99=30"]
    ramp = translate("vllm serve m", "vllm bench serve --dataset-name prefix_repetition "
                     "--prefix-repetition-num-prefixes 4 --ramp-up-strategy linear --ramp-up-start-rps 1 "
                     "--ramp-up-end-rps 20 --num-prompts 400 --ignore-eos --burstiness 0.5", "h100-sxm")
    assert ramp.words[4:] == ["--workload", "prefix_repetition", "-p", "num_prefixes=4", "--requests", "400",
                              "--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "20",
                              "--burstiness", "0.5"]


MULTI_TURN = "python benchmarks/multi_turn/benchmark_serving_multi_turn.py -m /models/llama -i conv.json"


def test_vllms_multi_turn_benchmark_imports_its_input_then_runs_its_clients():
    # benchmarks/multi_turn: -p clients, -k active conversations, -n requests; its input imported turn by turn
    t = translate("vllm serve m", MULTI_TURN + " -p 8 -k 64 -n 500 --max-turns 6 -u http://h:8000 --no-early-stop "
                  "--seed 5 --warmup-percentages 0", "h100-sxm")
    # (its --seed draws the conversations of a generation config, and seeds its clients' generators)
    assert t.before == [["workload", "import", "conv.json", "--format", "conversations", "--tokenizer",
                         "/models/llama", "--max-turns", "6", "--seed", "5", "-o", "conv-turns.jsonl"]]
    # its -n is a limit its clients share, 500 // 8 each
    assert t.words[4:] == ["--trace", "conv-turns.jsonl", "--concurrency", "8", "--max-active-conversations", "64",
                           "--client-max-requests", "62", "--client-turnaround", "0.001", "--seed", "5"]
    no_eos = ("the benchmark sends no ignore_eos: its answers end at EOS or at their max_tokens (the dataset "
              "answer's length, or --limit-max-tokens), and the planner generates the whole length")
    assert t.ignored == ["--no-early-stop", "--url"] and t.not_modelled == [no_eos]
    # its defaults (no pause, the dataset's output lengths) are the planner's; other values are not modelled
    other = translate("vllm serve m", MULTI_TURN + " --request_rate=0.0 --warmup-step "
                      "--limit-max-tokens 0 --conversation-sampling random --warmup-percentages 0%,50%", "h100-sxm")
    assert other.not_modelled == [no_eos]
    assert other.ignored == ["--warmup-percentages (the benchmark ignores it with --warmup-step)"]
    # without --no-early-stop, its clients stop when the first stops; its warm-up step and random sampling are
    # the planner's
    assert other.words[4:] == ["--trace", "conv-turns.jsonl", "--concurrency", "1", "--client-turnaround", "0.001",
                               "--client-early-stop", "--client-warmup-step", "--conversation-sampling", "random"]
    with pytest.raises(PlannerError, match="--conversation-sampling 'rand': choose round_robin or random"):
        translate("vllm serve m", MULTI_TURN + " --conversation-sampling rand", "h100-sxm")
    # its --warmup-percentages X%: the figures over the answered requests after the first X% as sent; of several
    # values (a table each) the first table's, with a warning
    assert translate("vllm serve m", MULTI_TURN + " --warmup-percentages 25%", "h100-sxm").words[-2:] == \
        ["--client-warmup-percent", "25"]
    several = translate("vllm serve m", MULTI_TURN + " --warmup-percentages=50%,25%", "h100-sxm")
    assert several.words[-2:] == ["--client-warmup-percent", "25"]
    assert several.not_modelled[0].startswith("--warmup-percentages 50%,25%: one figure set a run")
    for bad in ("abc", "100%", "-5%"):
        with pytest.raises(PlannerError, match="--warmup-percentages .*expected percentages from 0 up to 100"):
            translate("vllm serve m", MULTI_TURN + f" --warmup-percentages={bad}", "h100-sxm")
    # its --limit-max-tokens is every request's max_tokens: the imported answers' length (the minimum is checked,
    # then never sent); a negative limit sends none
    limited = translate("vllm serve m", MULTI_TURN + " --limit-min-tokens 50 --limit-max-tokens 100", "h100-sxm")
    assert limited.before[0][-4:] == ["--output-len", "100", "-o", "conv-turns.jsonl"]
    assert limited.ignored == ["--limit-min-tokens"] and limited.not_modelled == [no_eos]
    unlimited = translate("vllm serve m", MULTI_TURN + " --limit-max-tokens -1", "h100-sxm")
    assert "--output-len" not in unlimited.before[0] and len(unlimited.not_modelled) == 2
    paced = translate("vllm serve m", MULTI_TURN + " --request-rate 2 --no-early-stop", "h100-sxm")
    assert paced.words[-4:] == ["--client-request-rate", "2", "--client-turnaround", "0.001"]
    assert paced.not_modelled == [no_eos]
    most = translate("vllm serve m", MULTI_TURN + " -p 4 -k 16", "h100-sxm", capacity=True)
    assert "--concurrency max --max-active-conversations 16" in most.command and most.searched == ["--num-clients 4"]
    for bench, message in ((MULTI_TURN.replace(" -i conv.json", ""), "--input-file is required"),
                           (MULTI_TURN + " -p 4 -n 3", "at least one request a client"),
                           (MULTI_TURN + " --limit-max-tokens 100", "needs both, at least 1"),
                           (MULTI_TURN + " --limit-min-tokens 9 --limit-max-tokens 5", "the minimum no larger"),
                           (MULTI_TURN + " --bogus 1", "--bogus is not a flag the planner knows")):
        with pytest.raises(PlannerError, match=message):
            translate("vllm serve m", bench, "h100-sxm")


def test_vllm_bench_txt_slices_is_the_random_workloads_lengths():
    # --dataset-name txt-slices: every prompt --random-input-len tokens of the text, every output
    # --random-output-len; the text, the range ratio and the prefix length are not read by vLLM for it
    t = translate("vllm serve m", "vllm bench serve --dataset-name txt-slices --dataset-path pg1184.txt "
                  "--random-input-len 2000 --random-output-len 200 --random-range-ratio 0.5 --max-concurrency 8 "
                  "--ignore-eos", "h100-sxm")
    assert t.words[4:] == ["--workload", "random", "-p", "input_len=2000", "-p", "output_len=200", "--requests",
                           "1000", "--concurrency", "8", "--client-turnaround", "0.001"]
    assert t.ignored == ["--ignore-eos", "--dataset-path", "--random-range-ratio"] and t.not_modelled == []
    with pytest.raises(PlannerError, match="import the file first"):     # another dataset's file is imported
        translate("vllm serve m", "vllm bench serve --dataset-name sonnet --dataset-path p.txt", "h100-sxm")


def test_capacity_searches_the_load_the_bench_fixed():
    # clients with --max-concurrency: the most clients within the --goodput SLOs; else the highest rate
    clients = translate(SERVE, LOAD + " --goodput ttft:500 tpot:20", "h100-sxm", capacity=True)
    assert clients.command.startswith("planner capacity --model Qwen/Qwen3-8B --gpu h100-sxm")
    assert clients.words[-8:] == ["--requests", "1024", "--concurrency", "max", "--client-turnaround", "0.001",
                                  "--slo", "ttft_p99=0.5,tpot_p99=0.02"]
    assert "--rate" not in clients.words
    assert clients.searched == ["--request-rate 25", "--max-concurrency 96"]
    rate = translate("vllm serve m", "vllm bench serve --request-rate 8 --burstiness 0.5 --ramp-up-strategy linear "
                     "--ramp-up-start-rps 1 --ramp-up-end-rps 9 --goodput e2el:4000 --ignore-eos", "h100-sxm",
                     capacity=True)
    assert rate.words[4:] == ["--workload", "random", "--requests", "1000", "--burstiness", "0.5", "--slo",
                              "e2e_p99=4"]
    assert rate.searched == ["--request-rate 8", "--ramp-up-strategy linear", "--ramp-up-start-rps 1",
                             "--ramp-up-end-rps 9"]
    with pytest.raises(PlannerError, match="a recording .* holds the load it ran"):
        translate("vllm serve m", None, "h100-sxm", measured="r.json", capacity=True)


@pytest.mark.parametrize("serve, bench, message", [
    ("vllm serve m --foo 1", None, "vllm serve: --foo is not a flag the planner knows"),
    ("vllm serve --port 8000", None, "vllm serve: no model"),
    ("vllm serve m --speculative-config '{\"method\": \"medusa\", \"num_speculative_tokens\": 2}'", None,
     "method 'medusa' is not one the planner prices"),
    ("vllm serve m", "vllm bench serve --dataset-name sharegpt --dataset-path sg.json",
     "--dataset-path sg.json: import the file first (planner workload import sg.json --format sharegpt "
     "--tokenizer MODEL_DIR -n 1000 --seed 0 -o trace.jsonl) and simulate --trace trace.jsonl"),
    ("vllm serve m", "vllm bench serve --custom-output-len 64 --dataset-name custom --skip-chat-template "
     "--dataset-path p.jsonl --num-prompts 50 --disable-shuffle",
     "(planner workload import p.jsonl --format custom --tokenizer MODEL_DIR -n 50 --seed 0 --output-len 64 "
     "--skip-chat-template --disable-shuffle -o trace.jsonl)"),
    ("vllm serve m", "vllm bench serve --dataset-name burstgpt --dataset-path b.csv --seed 3 --disable-shuffle",
     "(planner workload import b.csv --format burstgpt -n 1000 --seed 3 -o trace.jsonl)"),
    ("vllm serve m", "vllm bench serve --dataset-name sonnet --dataset-path s.txt --sonnet-prefix-len 100 "
     "--disable-shuffle", "(planner workload import s.txt --format sonnet --tokenizer MODEL_DIR -n 1000 --seed 0 "
     "--prefix-len 100 -o trace.jsonl)"),
    ("vllm serve m", "vllm bench serve --dataset-name hf --dataset-path x/y",
     "--dataset-name hf --dataset-path x/y: the planner imports sharegpt, custom, sonnet, burstgpt files"),
    ("vllm serve m", "vllm bench serve --dataset-name sonnet", "--dataset-name sonnet: the planner generates"),
    ("vllm serve m", "vllm bench serve --random-input-len 10 --dataset-name prefix_repetition",
     "--random-input-len is not a parameter of --dataset-name prefix_repetition"),
    ("vllm serve m", "vllm bench serve --goodput ttft=2", "--goodput 'ttft=2': expected ttft:MS"),
    ("vllm serve m", "vllm bench serve --bar 2", "vllm bench serve: --bar is not a flag the planner knows"),
    ("vllm serve m", "vllm bench serve --request-rate fast", "--request-rate 'fast' is not a number"),
    ("vllm serve m --max-model-len", None, "vllm serve: --max-model-len needs a value"),
    ("vllm serve m --speculative-config '{nope'", None,
     "--speculative-config is not valid JSON (line 1: Expecting property name"),
    ("vllm serve 'm", None, "cannot split the command line"),
])
def test_what_cannot_be_translated_is_refused_in_one_line(serve, bench, message):
    with pytest.raises(PlannerError, match=re.escape(message)):
        translate(serve, bench, "h100-sxm")
    result = CliRunner().invoke(app, ["from-vllm", "--gpu", "h100-sxm", "--serve", serve,
                                      *(["--bench", bench] if bench else [])])
    assert result.exit_code == 2 and result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


def test_run_simulates_the_public_run_as_its_bench_does(bench, tmp_path):
    # the translated line and bench/bench_public_qwen3_8b.py (which builds its Deployment and load itself)
    # simulate the same run to the last digit
    result = CliRunner().invoke(app, ["from-vllm", "--gpu", "h100-sxm", "--serve", SERVE, "--bench", LOAD, "--run",
                                      "--", "--json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    # the command line on stderr, the run's one JSON document alone on stdout
    line = next(line for line in result.stderr.splitlines() if line.startswith("planner "))
    assert line.startswith("planner simulate --model Qwen/Qwen3-8B") and line.endswith("--json --out " + str(tmp_path))
    doc = json.loads(result.stdout)
    runs, _ = bench.load_runs()
    run = next(r for r in runs if (r.flags, r.rate, r.clients, r.input_len) == ("defaults", 25.0, 96, 512))
    assert (doc["ttft_mean"], doc["tpot_mean"], doc["e2e_mean"], doc["duration"]) == bench.predict(run)


def test_a_recorded_bench_run_becomes_a_validate_line(tmp_path):
    # vllm bench serve --save-result --save-detailed: its requests replayed at their send times
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"input_lens": [512] * 4, "output_lens": [64] * 4, "ttfts": [0.03] * 4,
                                "itls": [[0.007] * 63] * 4, "start_times": [0.0, 0.5, 1.0, 1.5], "errors": [""] * 4}))
    t = translate("vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len 8192", None, "h100-sxm", str(path))
    assert t.command == (f"planner validate --model meta-llama/Llama-3.1-8B-Instruct --gpu h100-sxm "
                         f"--max-model-len 8192 --measured {path}")
    with pytest.raises(PlannerError, match="not both: a recording holds its own load"):
        translate("vllm serve m", "vllm bench serve", "h100-sxm", str(path))
    result = CliRunner().invoke(app, ["from-vllm", "--gpu", "h100-sxm", "--serve", "vllm serve "
                                      "meta-llama/Llama-3.1-8B-Instruct --max-model-len 8192", "--measured", str(path),
                                      "--run", "--", "--json", "--out", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout.strip().splitlines()[-1])
    assert doc["comparison"]["ttft_mean"]["measured"] == pytest.approx(0.03)
    assert doc["num_completed"] == {"measured": 4, "simulated": 4}


WORDS = st.sampled_from([*SERVE_VALUED, *SERVE_RENAMED, *SERVE_SWITCHES, *BENCH_LOAD, "--goodput", "--dataset-name",
                         "--speculative-config", "--eplb-config", "--random-input-len", "--dataset-path", "--port",
                         "--enforce-eager", "8", "-1", "inf", "nan", "x", "ttft:5", "random", "{}", '{"method": 1}',
                         "[1]", "=", "--", "'", '"', "--x=", "serve", "-i", "-m", "-p", "-k", "-n",
                         "--max-turns", "--warmup-step", "--request-rate", "--no-early-stop",
                         "--conversation-sampling"])
BENCH_PROGRAMS = st.sampled_from(["vllm bench serve", "python benchmark_serving_multi_turn.py"])


@settings(max_examples=300, deadline=None)
@given(serve=st.lists(WORDS, max_size=8), bench=st.none() | st.lists(WORDS, max_size=8), program=BENCH_PROGRAMS)
def test_any_command_line_is_translated_or_refused_in_words(serve, bench, program):
    """Whatever the operator pastes, the translation ends in a line or a PlannerError, never a traceback."""
    try:
        translate(" ".join(["vllm", "serve", "m", *serve]), None if bench is None else
                  " ".join([program, *bench]), "h100-sxm")
    except PlannerError:
        pass
