"""Trace files as a user hands them over: production CSVs by header, `planner workload import`,
hand-written CSVs without request_id, -p parameters, and corrupt files named by line and field."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner.cli.app import app
from test_workloads_importers import AZURE, sharegpt_file, text, tokenizer_dir  # noqa: F401 (fixture)
from workloads import Trace, TraceError, parse_workload_params

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_production_csv_is_detected_by_its_header(tmp_path):
    path = tmp_path / "azure_code.csv"
    path.write_text(AZURE)
    trace = Trace.load(path)
    assert [r.arrival_time for r in trace] == [0.0, 4.314579, 4.31941, 19.739922]
    assert [(r.prompt_len, r.output_len) for r in trace] == [(374, 44), (396, 109), (879, 55), (91, 16)]


def test_simulate_runs_a_production_csv(tmp_path):
    path = tmp_path / "azure_code.csv"
    path.write_text(AZURE)
    result = invoke("simulate", "--trace", path, "--model", "opt-125m", "--out", tmp_path / "run", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["num_submitted"] == 4
    assert doc["num_completed"] + doc["num_rejected"] + doc["num_truncated"] == 4


def test_simulate_names_the_corrupt_line_and_field_of_a_production_csv(tmp_path):
    path = tmp_path / "azure_bad.csv"
    path.write_text(AZURE.replace(",396,109", ",396,many"))
    result = invoke("simulate", "--trace", path, "--out", tmp_path / "run")
    assert result.exit_code == 2
    assert "azure_bad.csv:3: GeneratedTokens: not a number of tokens: 'many'" in result.output
    assert "Traceback" not in result.output


def test_import_azure_writes_a_trace_that_loads_back(tmp_path):
    src = tmp_path / "azure_conv.csv"
    src.write_text(AZURE)
    out = tmp_path / "conv.jsonl"
    result = invoke("workload", "import", src, "--format", "azure", "-o", out, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["count"] == 4
    assert Trace.load(out) == Trace.load(src)


def test_import_azure_zero_rows(tmp_path):
    src = tmp_path / "zeros.csv"
    src.write_text(AZURE.replace(",879,55", ",879,0"))
    result = invoke("workload", "import", src, "--format", "azure", "-o", tmp_path / "t.jsonl")
    assert result.exit_code == 2 and "zeros.csv:4: GeneratedTokens: length must be >= 1, got 0" in result.output
    result = invoke("workload", "import", src, "--format", "azure", "--drop-zero", "-o", tmp_path / "t.jsonl")
    assert result.exit_code == 0, result.output
    assert len(Trace.load(tmp_path / "t.jsonl")) == 3 and "skipped 1 rows" in result.output


def test_import_sharegpt_needs_a_tokenizer_and_samples(tmp_path, tokenizer_dir):  # noqa: F811
    src = sharegpt_file(tmp_path, [(text(5 + i), text(7 + i)) for i in range(10)])
    out = tmp_path / "sg.jsonl"
    result = invoke("workload", "import", src, "--format", "sharegpt", "-o", out)
    assert result.exit_code == 2 and "--tokenizer" in result.output
    result = invoke("workload", "import", src, "--format", "sharegpt", "--tokenizer", tokenizer_dir,
                    "-n", 4, "--rate", 2, "-o", out)
    assert result.exit_code == 0, result.output
    trace = Trace.load(out)
    assert len(trace) == 4 and all(r.prompt_len >= 5 and r.output_len >= 7 for r in trace)


def test_import_custom_prompts_as_vllm_bench_reads_them(tmp_path, tokenizer_dir):  # noqa: F811
    src = tmp_path / "mine.jsonl"
    src.write_text("".join(json.dumps({"prompt": text(4 + i)}) + "\n" for i in range(3)))
    out = tmp_path / "custom.jsonl"
    result = invoke("workload", "import", src, "--format", "custom", "--tokenizer", tokenizer_dir,
                    "--skip-chat-template", "--output-len", 64, "-n", 5, "-o", out)
    assert result.exit_code == 0, result.output
    trace = Trace.load(out)
    assert len(trace) == 5 and {r.output_len for r in trace} == {64} and {r.prompt_len for r in trace} <= {4, 5, 6}
    result = invoke("workload", "import", src, "--format", "custom", "--tokenizer", tokenizer_dir,
                    "--skip-chat-template", "--no-oversample", "-n", 5, "-o", out)
    assert result.exit_code == 0 and len(Trace.load(out)) == 3
    result = invoke("workload", "import", src, "--format", "custom", "--tokenizer", tokenizer_dir, "-o", out)
    assert result.exit_code == 2 and "give --skip-chat-template" in result.output
    result = invoke("workload", "import", src, "--format", "csv", "--skip-chat-template", "-o", out)
    assert result.exit_code == 2 and "--skip-chat-template: not used with --format csv" in result.output


def test_import_csv_and_unknown_format(tmp_path):
    src = tmp_path / "hand.csv"
    src.write_text("arrival_time,prompt_len,output_len\n0,10,5\n0.5,20,8\n")
    out = tmp_path / "hand.jsonl"
    assert invoke("workload", "import", src, "--format", "csv", "-o", out).exit_code == 0
    assert [(r.request_id, r.prompt_len) for r in Trace.load(out)] == [("hand-0", 10), ("hand-1", 20)]
    result = invoke("workload", "import", src, "--format", "parquet", "-o", out)
    assert result.exit_code == 2
    assert "azure, sharegpt, conversations, custom, sonnet, burstgpt, mooncake, csv" in result.output


def test_hand_written_csv_and_jsonl_without_request_id(tmp_path):
    csv_path = tmp_path / "mine.csv"
    csv_path.write_text("arrival_time,prompt_len,output_len,n\n0,10,5,\n1.5,20,8,2\n")
    trace = Trace.load(csv_path)
    assert [(r.request_id, r.n) for r in trace] == [("mine-0", 1), ("mine-1", 2)]
    jsonl = tmp_path / "mine.jsonl"
    jsonl.write_text('{"arrival_time": 0, "prompt_len": 3, "output_len": 4}\n'
                     '{"request_id": "x", "arrival_time": 1, "prompt_len": 3, "output_len": 4}\n')
    assert [r.request_id for r in Trace.load(jsonl)] == ["mine-0", "x"]


@pytest.mark.parametrize("body, pattern", [
    ("arrival_time,prompt_len,output_len,n\n0,10,5,1\n1,2,3\n", r"bad\.csv:3: row has 3 cells, header has 4"),
    ("arrival_time,prompt_len,output_len\n0,10,5,1\n", r"bad\.csv:2: row has 4 cells, header has 3"),
    ("arrival_time,prompt_len,output_len\n0,ten,5\n", r"bad\.csv:2: prompt_len: .*integer"),
    ("arrival_time,prompt_len\n0,10\n", r"bad\.csv:1: output_len: missing column"),
    ("arrival_time,prompt_len,output_len\n2,10,5\n1,10,5\n", r"bad\.csv:3: arrival_time: .*must not decrease"),
])
def test_corrupt_csv_is_named_with_line_and_field(tmp_path, body, pattern):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(TraceError, match=pattern):
        Trace.load(path)


def test_workload_params_parse_typed_with_clear_errors():
    assert parse_workload_params("parallel", ["n=2"]) == {"n": 2}
    assert parse_workload_params("uniform", ["prompt_max=64", " output_min = 2"]) == {"prompt_max": 64, "output_min": 2}
    assert parse_workload_params("sharegpt", []) == {}
    with pytest.raises(TraceError, match="expected KEY=VALUE with KEY one of n"):
        parse_workload_params("parallel", ["width=2"])
    with pytest.raises(TraceError, match="--param n: expected int, got 'two'"):
        parse_workload_params("parallel", ["n=two"])
    with pytest.raises(TraceError, match="a trace file takes no workload parameters"):
        parse_workload_params("mine.jsonl", ["n=2"])
