"""BurstGPT logs (Timestamp, Model, Request tokens, Response tokens): vLLM bench's sample, or the log's own times."""

import random

import pandas as pd
import pytest
from typer.testing import CliRunner

from planner.cli.app import app
from workloads import Trace, TraceError, import_burstgpt
from workloads.arrivals import arrival_times
from workloads.tokens import stream

HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def burstgpt_file(tmp_path, rows=None, name="burst.csv"):
    """A log of 60 rows: ChatGPT and GPT-4 interleaved, some failed (no response) and a few empty prompts."""
    if rows is None:
        draw = random.Random(1)
        rows = []
        for i in range(60):
            prompt = 0 if i % 17 == 3 else draw.randint(1, 3000)
            response = 0 if i % 7 == 2 else draw.randint(1, 900)
            rows.append((i * 3 + draw.randint(0, 2), "GPT-4" if i % 3 else "ChatGPT", prompt, response))
    path = tmp_path / name
    path.write_text(HEADER + "".join(f"{t},{m},{p},{r},{p + r},Conversation log\n" for t, m, p, r in rows))
    return path


def vllm_bench_draw(path, num_requests, seed):
    """What vLLM bench's BurstGPTDataset sends: (request tokens, response tokens) of each drawn row, in order."""
    df = pd.read_csv(path)
    df = df[df["Model"] == "GPT-4"]
    df = df[df["Response tokens"] > 0]
    sample = df.sample(n=num_requests, random_state=seed, replace=num_requests > len(df))
    return [(int(row[2]), int(row[3])) for row in sample.values.tolist()]


@pytest.mark.parametrize("num_requests, seed", [(12, 0), (30, 7), (100, 3)])   # 100: more than the file has
def test_sample_is_vllm_benchs_draw(tmp_path, num_requests, seed):
    path = burstgpt_file(tmp_path)
    trace = import_burstgpt(path, num_requests, seed, rate=4.0)
    drawn = vllm_bench_draw(path, num_requests, seed)
    # a drawn row with no request tokens is an empty prompt, which vLLM's server rejects: left out
    assert [(r.prompt_len, r.output_len) for r in trace] == [pair for pair in drawn if pair[0] > 0]
    assert [r.request_id for r in trace] == [f"burstgpt-{i}" for i, pair in enumerate(drawn) if pair[0] > 0]
    assert trace.params["empty_prompts"] == sum(pair[0] == 0 for pair in drawn)
    assert trace.params["available"] == 34          # the GPT-4 rows with a response
    # a left-out request keeps its arrival slot: the others arrive when they would have with it
    times = arrival_times(stream(seed, "arrivals"), arrival="poisson", rate=4.0, cv=1.0, num_requests=num_requests)
    assert [r.arrival_time for r in trace] == [float(times[int(r.request_id.split("-")[1])]) for r in trace]


def test_arrivals_are_generated_at_the_rate(tmp_path):
    trace = import_burstgpt(burstgpt_file(tmp_path), 400, rate=10.0, arrival="constant")
    gaps = {round(b.arrival_time - a.arrival_time, 6) for a, b in zip(trace.requests, trace.requests[1:])}
    assert gaps <= {0.1, 0.2, 0.3}        # a left-out empty prompt's slot doubles a gap
    assert all(r.arrival_time == 0 for r in import_burstgpt(burstgpt_file(tmp_path), 50))   # default: all at once


def test_keep_times_is_the_logs_own_arrivals(tmp_path):
    rows = [(5, "ChatGPT", 472, 18), (45, "GPT-4", 1087, 0), (118, "GPT-4", 417, 276), (130, "GPT-4", 0, 50),
            (151, "GPT-4", 1024, 128), (200.5, "GPT-4", 55, 5), (201, "ChatGPT", 9, 9)]
    trace = import_burstgpt(burstgpt_file(tmp_path, rows), keep_times=True)
    assert [(r.arrival_time, r.prompt_len, r.output_len) for r in trace] == [
        (0.0, 417, 276), (33.0, 1024, 128), (82.5, 55, 5)]
    assert trace.params["dropped_rows"] == 2 and trace.params["only"] == ["Model", "GPT-4"]
    assert len(import_burstgpt(burstgpt_file(tmp_path, rows), 2, keep_times=True)) == 2
    assert len(import_burstgpt(burstgpt_file(tmp_path, rows), keep_times=True, duration=82.5)) == 2


def test_keep_times_reads_a_long_log_only_as_far_as_the_duration(tmp_path):
    # a log longer than a trace may span (the cap is 10^7 s): an hour of it imports; the whole is refused
    rows = [(0, "GPT-4", 10, 5), (1800, "GPT-4", 20, 6), (3599, "GPT-4", 30, 7), (2e7, "GPT-4", 40, 8)]
    path = burstgpt_file(tmp_path, rows)
    assert [r.prompt_len for r in import_burstgpt(path, keep_times=True, duration=3600)] == [10, 20, 30]
    with pytest.raises(TraceError, match="over the cap"):
        import_burstgpt(path, keep_times=True)


@pytest.mark.parametrize("body, pattern", [
    ("Timestamp,Request tokens,Response tokens\n1,2,3\n", r"burst.csv:1: Model: missing column"),
    (HEADER + "1,GPT-4,12x,3,15,API log\n", r"burst.csv:2: Request tokens: not a number of tokens: '12x'"),
    (HEADER + "1,GPT-4,12,-3,9,API log\n", r"burst.csv:2: Response tokens: length must be >= 0, got -3"),
    (HEADER + "1,GPT-4,12,3\n", r"burst.csv:2: row has 4 cells, header has 6"),
    (HEADER + "1,ChatGPT,12,3,15,API log\n1,GPT-4,12,0,12,API log\n", r"no Model GPT-4 rows with a response"),
])
def test_errors_name_the_file_line_and_column(tmp_path, body, pattern):
    path = tmp_path / "burst.csv"
    path.write_text(body)
    with pytest.raises(TraceError, match=pattern):
        import_burstgpt(path, 10)


def test_cli_import_and_its_refusals(tmp_path):
    path = burstgpt_file(tmp_path)
    out = tmp_path / "t.jsonl"

    def run(*args):
        return CliRunner().invoke(app, ["workload", "import", str(path), "--format", "burstgpt", "-o", str(out),
                                        *args])

    result = run("-n", "30", "--seed", "7", "--rate", "4")
    assert result.exit_code == 0, result.output
    assert [(r.prompt_len, r.output_len) for r in Trace.load(out)] == [
        pair for pair in vllm_bench_draw(path, 30, 7) if pair[0] > 0]
    assert "left out 1 drawn rows with no request tokens" in " ".join(result.output.split())
    result = run("--keep-times", "--seed", "3")
    assert result.exit_code == 2 and "--seed: not used with --keep-times" in result.output
    result = run("--tokenizer", str(tmp_path))
    assert result.exit_code == 2 and "--tokenizer: not used with --format burstgpt" in result.output
    result = CliRunner().invoke(app, ["workload", "import", str(path), "--format", "azure", "-o", str(out),
                                      "--keep-times"])
    assert result.exit_code == 2 and "--keep-times: not used with --format azure" in result.output
