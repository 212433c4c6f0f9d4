"""`planner workload list|show`, driven through typer's CliRunner against the sub-app."""

import json

import pytest
from typer.testing import CliRunner

from planner.cli.workload import app
from workloads import Trace, WORKLOADS

runner = CliRunner()


def test_list_names_every_workload():
    result = runner.invoke(app, ["list"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for name in WORKLOADS:
        assert name in result.stdout
    assert "[prompt_min, prompt_max]" in result.stdout  # descriptions are not eaten as markup


def test_show_json_statistics():
    result = runner.invoke(app, ["show", "alpaca", "--rate", "5", "--requests", "2000", "--seed", "1", "--json"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)
    assert stats["count"] == 2000
    assert stats["arrival_rate"] == pytest.approx(5.0, rel=0.1)
    assert stats["prompt_len_mean"] == pytest.approx(19.31, rel=0.05)
    for key in ("duration", "prompt_len_median", "prompt_len_p99", "output_len_mean", "output_len_p99"):
        assert key in stats


def test_show_all_at_once_reports_null_rate():
    result = runner.invoke(app, ["show", "fixed", "-n", "10", "--json", "-p", "prompt_len=64"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)
    assert stats["arrival_rate"] is None and stats["prompt_len_mean"] == 64


def test_show_saves_trace_and_histogram(tmp_path):
    out, png = tmp_path / "t.jsonl", tmp_path / "h.png"
    args = ["show", "prefix", "--rate", "2", "--arrival", "gamma", "--cv", "2", "--duration", "60",
            "-p", "shots=5", "--save", str(out), "--hist", str(png)]
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "prompt_len_mean" in result.stdout
    trace = Trace.load(out)
    assert trace.params["shots"] == 5 and trace.params["arrival"] == "gamma"
    assert all(r.prefix_len == 341 for r in trace)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a saved trace can be shown again, keeping its timestamps
    again = runner.invoke(app, ["show", str(out), "--json"])
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["count"] == len(trace)


@pytest.mark.parametrize(
    "args,message",
    [
        (["show", "nope"], "unknown name 'nope'"),
        (["show", "alpaca", "--rate", "-1"], "rate: must be > 0"),
        (["show", "alpaca", "-p", "n=3"], "--param 'n=3'"),
        (["show", "parallel", "-p", "n=many"], "expected int"),
        (["show", "alpaca", "--arrival", "weibull", "--rate", "1"], "arrival: unknown process"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output


def test_malformed_file_is_one_line_and_exit_2(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"request_id":"a","arrival_time":0,"prompt_len":4,"output_len":2}\nnot json\n')
    result = runner.invoke(app, ["show", str(path)])
    assert result.exit_code == 2
    assert "broken.jsonl:2: invalid JSON" in result.stderr and result.stderr.count("\n") == 1
