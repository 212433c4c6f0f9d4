"""`planner validate --endpoint` (a running server) and `--measured` (a recorded run)."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from engine.llm_engine import LLMEngine
from planner.cli.app import app
from engine.entrypoints.openai.server import BackgroundServer
from planner.validation.external import measured_records, read_measured
from serve_helpers import save_byte_model

# It reads the wall clock (a live engine, a server, a time limit): scripts/test.sh runs it alone.
pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_byte_model(tmp_path_factory.mktemp("byte-llama"))


def invoke(*args):
    return CliRunner().invoke(app, ["validate", *map(str, args)])


def test_endpoint_settings_come_from_the_server_and_both_sides_complete(folder, tmp_path):
    engine = LLMEngine(folder, block_size=8, num_gpu_blocks=96, max_num_seqs=12)
    with BackgroundServer(engine, "tiny", folder) as srv:
        result = invoke("--endpoint", srv.url, "--model", folder, "--gpu", "cpu", "--workload", "alpaca",
                        "--requests", "6", "--rate", "30", "--length-scale", "0.1", "--max-output-len", "6",
                        "--out", tmp_path / "run", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["num_completed"] == {"measured": 6, "simulated": 6}
    assert doc["deployment_sources"]["block_size"] == "8 (/metrics)"
    assert doc["deployment_sources"]["num_gpu_blocks"] == "96 (/metrics)"
    assert doc["deployment_sources"]["max_num_seqs"] == "12 (/metrics)"
    assert doc["deployment_sources"]["max_model_len"] == "128 (/metrics)"
    assert doc["comparison"]["ttft_mean"]["measured"] > 0 and doc["comparison"]["e2e_mean"]["simulated"] > 0
    assert (tmp_path / "run" / "report.md").exists()


RECORDED = [{"request_id": "a", "arrival_time": 100.0, "prompt_len": 12, "output_len": 5,
             "first_token_time": 100.2, "finish_time": 100.6},
            {"request_id": "b", "queued_time": 100.5, "prompt_len": 30, "output_len": 1,
             "first_token_time": 100.9, "finish_time": 100.9}]


def test_measured_jsonl_gives_the_measured_metrics(folder, tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDED))
    rows = read_measured(path)
    assert [(r.arrival, r.first_token) for r in rows] == [(0.0, pytest.approx(0.2)), (0.5, pytest.approx(0.9))]
    records = measured_records(rows)
    assert records[0].tpot == pytest.approx(0.1)           # (0.6 - 0.2) / (5 - 1)
    result = invoke("--measured", path, "--model", folder, "--gpu", "cpu", "--block-size", "8",
                    "--num-gpu-blocks", "64", "--max-num-seqs", "8", "--out", tmp_path / "rep", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["comparison"]["ttft_mean"]["measured"] == pytest.approx(0.3)
    assert doc["num_completed"] == {"measured": 2, "simulated": 2}
    assert doc["deployment_sources"]["num_gpu_blocks"] == "64 (flag)"
    # the report describes the recording, not a generated trace's defaults
    assert (doc["requests"], doc["rate"], doc["length_scale"]) == (2, None, 1.0)
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "- trace: the recorded run run.jsonl: 2 requests sent at their recorded times, lengths as recorded" in report
    assert " max 8 seqs," in report


VLLM = {"input_lens": [10, 20], "output_lens": [3, 0], "ttfts": [0.2, 0.0], "itls": [[0.1, 0.1], []],
        "start_times": [5.0, 5.5], "errors": ["", "Bad Request"]}


def test_measured_reads_bench_csv_and_vllm_detailed_json(tmp_path):
    csv_path = tmp_path / "requests.csv"
    csv_path.write_text("request_id,arrival,start,prompt_len,expected_output_len,output_len,first_token,finish,"
                        "ttft,tpot,e2e,itl_mean,success,finish_reason,error\n"
                        "r0,0.0,0.01,8,4,4,0.11,0.41,0.1,0.1,0.4,0.1,True,length,\n"
                        "r1,0.5,0.51,9,4,0,,,,,,,False,,HTTP 400: too long\n")
    rows = read_measured(csv_path)
    assert [r.failed for r in rows] == [False, True] and rows[0].first_token == pytest.approx(0.1)

    json_path = tmp_path / "vllm.json"
    json_path.write_text(json.dumps(VLLM))
    rows = read_measured(json_path)
    assert (rows[0].first_token, rows[0].finish) == (pytest.approx(0.2), pytest.approx(0.4))
    assert rows[1].failed and rows[1].error == "Bad Request"


@pytest.mark.parametrize("name, content, message", [
    ("bad.jsonl", json.dumps(RECORDED[0]) + "\n" + '{"arrival_time": 1, "prompt_len": 3, "output_len": 2}\n',
     "bad.jsonl:2: field 'first_token_time' is missing"),
    ("nan.jsonl", '{"arrival_time": "soon", "prompt_len": 3}\n', "nan.jsonl:1: field 'arrival_time' is not a number"),
    ("broken.jsonl", '{"arrival_time": 1,\n', "broken.jsonl:1: not valid JSON (line 1: Expecting property name"),
    ("old.json", json.dumps({"input_lens": [1], "output_lens": [1], "ttfts": [0.1], "itls": [[]]}),
     "old.json: field 'start_times' is missing"),
    # were an OverflowError, a run that filled the memory, a TypeError and an IndexError
    ("inf.jsonl", json.dumps({**RECORDED[0], "output_len": float("inf")}),
     "inf.jsonl:1: field 'output_len' is out of range: inf"),
    ("huge.jsonl", json.dumps({**RECORDED[0], "prompt_len": 1e308}),
     "huge.jsonl:1: field 'prompt_len' is out of range: 1e+308 (0 to 10,000,000 tokens)"),
    ("starts.json", json.dumps({**VLLM, "start_times": ["x", 1]}),
     "starts.json: entry 0: field 'start_times' is not a number: 'x'"),
    ("errors.json", json.dumps({**VLLM, "errors": [1]}), "errors.json: field 'errors' must be a list as long as"),
    # were a TypeError, and recordings read as nonsense: a negative TTFT, "123" summed digit by digit as 6 s,
    # 10.7 tokens, true as 1, a request 1e300 s late, a whole run of failures judged as if it held up
    ("errnum.json", json.dumps({**VLLM, "errors": [5, 0]}),
     "errnum.json: entry 0: field 'errors' must hold a message or null, not 5"),
    ("negative.json", json.dumps({**VLLM, "ttfts": [-5, 0.0]}), "negative.json: entry 0: 'ttfts' and 'itls' must not"),
    ("itlstr.json", json.dumps({**VLLM, "itls": ["123", []]}), "itlstr.json: entry 0: field 'itls' must be a list"),
    ("frac.jsonl", json.dumps({**RECORDED[0], "prompt_len": 10.7}),
     "frac.jsonl:1: field 'prompt_len' is not a whole number of tokens: 10.7"),
    ("bool.jsonl", json.dumps({**RECORDED[0], "arrival_time": True}), "bool.jsonl:1: field 'arrival_time' is not a"),
    ("late.jsonl", json.dumps(RECORDED[0]) + "\n" + json.dumps({**RECORDED[0], "request_id": "z", "arrival_time": 1e300,
                                                                "first_token_time": 1e300, "finish_time": 1e300}),
     "late.jsonl: request z arrives 1e+300 s after the first, over the cap of 10,000,000 s"),
    ("failed.jsonl", json.dumps({**RECORDED[0], "success": False}), "failed.jsonl: every request in it failed"),
    ("binary.jsonl", None, "binary.jsonl: not UTF-8 text"),
    # were a RecursionError, a ValueError naming no file, a csv.Error and a TypeError; and, taken, two requests
    # of one id, more gaps than tokens, and a finish too late to compute with
    ("deep.jsonl", "[" * 100_000 + "]" * 100_000, "deep.jsonl:1: not valid JSON (nested too deeply)"),
    ("digits.jsonl", '{"prompt_len": ' + "1" * 5000 + "}", "digits.jsonl:1: not valid JSON (an integer of more"),
    ("cell.csv", "request_id,arrival\na," + "x" * 200_000 + "\n", "cell.csv:2: not a CSV row (field larger"),
    ("surrogate.jsonl", json.dumps({**RECORDED[0], "request_id": "\ud800"}),     # (json writes it as \ud800)
     "surrogate.jsonl:1: request_id holds a lone UTF-16 surrogate"),
    ("twice.jsonl", json.dumps(RECORDED[0]) + "\n" + json.dumps(RECORDED[0]), "twice.jsonl: request_id 'a' appears 2"),
    ("gaps.json", json.dumps({**VLLM, "itls": [[0.1] * 5, []]}), "gaps.json: entry 0: 'itls' holds 5 gaps, more than "
                                                                 "its 3 output tokens"),
    ("slow.jsonl", json.dumps({**RECORDED[0], "finish_time": 1e300}), "slow.jsonl: request a ends 1e+300 s after"),
])
def test_unreadable_recordings_name_file_line_and_field(folder, tmp_path, name, content, message):
    path = tmp_path / name
    if content is None:
        path.write_bytes(b"\x00\xb6\xff" * 10)
    else:
        path.write_text(content)
    result = invoke("--measured", path, "--model", folder, "--gpu", "cpu", "--out", tmp_path / "rep")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and message in result.stderr and result.stderr.count("\n") == 1


def test_endpoint_closed_loop_is_served_and_reprofile_times_this_device_around_the_bench(folder, tmp_path):
    # A server's clients join the step after the one running (a 1 ms turnaround unless told); --reprofile
    # profiles the device right before and right after the bench, and that profile prices the simulation.
    engine = LLMEngine(folder, block_size=8, num_gpu_blocks=96, max_num_seqs=12)
    with BackgroundServer(engine, "tiny", folder) as srv:
        result = invoke("--endpoint", srv.url, "--model", folder, "--gpu", "cpu", "--workload", "alpaca",
                        "--requests", "6", "--concurrency", "2", "--length-scale", "0.1", "--max-output-len", "6",
                        "--reprofile", "--out", tmp_path / "run", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["deployment_sources"]["client_turnaround"] == "0.001 (a served client's)"
    assert doc["rate"] is None and doc["concurrency"] == 2      # the clients alone: no default rate paces them
    assert doc["num_completed"] == {"measured": 6, "simulated": 6}
    assert (tmp_path / "run" / "profile.json").exists()
    assert str(tmp_path / "run" / "profile.json") in doc["cost_model"]
    assert "half right before and half right after" in doc["profile_check"]["reason"]
    assert "Profile check: **ok**" in (tmp_path / "run" / "report.md").read_text()


def test_endpoint_paced_by_a_rate_with_a_limit_in_flight(folder, tmp_path):
    # vLLM bench's --request-rate with --max-concurrency against a server, and the simulator run the same way.
    engine = LLMEngine(folder, block_size=8, num_gpu_blocks=96, max_num_seqs=12)
    with BackgroundServer(engine, "tiny", folder) as srv:
        result = invoke("--endpoint", srv.url, "--model", folder, "--gpu", "cpu", "--workload", "alpaca",
                        "--requests", "8", "--rate", "200", "--concurrency", "2", "--length-scale", "0.1",
                        "--max-output-len", "6", "--out", tmp_path / "run", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["rate"] == 200 and doc["concurrency"] == 2
    assert doc["num_completed"] == {"measured": 8, "simulated": 8}
    live = next(line for line in doc["verdict"]["lines"] if line.startswith("Live run:"))
    assert "requested 200 req/s, at most 2 requests in flight" in live
    assert "at 200 req/s (Poisson), at most 2 in flight" in (tmp_path / "run" / "report.md").read_text()


def test_a_served_engine_is_profiled_at_its_own_torch_threads(folder, monkeypatch):
    # A lone CPU server leaves one core to its HTTP frontend, and says how many threads its engine has:
    # validate --endpoint times its profile at that count (a profile timed with every core, nothing else
    # running, prices the served steps 13% fast on two cores: docs/calibration.md).
    import torch

    from engine.entrypoints.router.launch import server_threads
    from planner.validation.external import read_endpoint_settings, torch_threads
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert (server_threads("cpu"), server_threads("auto"), server_threads("cuda")) == (7, 7, None)
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert server_threads("cpu") == 1
    engine = LLMEngine(folder, block_size=8, num_gpu_blocks=96, max_num_seqs=12)
    with BackgroundServer(engine, "tiny", folder) as srv:
        reading = read_endpoint_settings(srv.url)
    assert reading.threads == torch.get_num_threads() and reading.metrics["block_size"] == "8"
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    with torch_threads(None):                   # a server that does not say (vLLM's): as it is
        assert torch.get_num_threads() == before
    assert torch.get_num_threads() == before


def test_reprofile_needs_a_server_here(tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDED))
    result = invoke("--measured", path, "--model", "opt-125m", "--gpu", "cpu", "--reprofile")
    assert result.exit_code != 0 and "--reprofile times this machine's device around a live run" in result.output
    assert "Traceback" not in result.output
