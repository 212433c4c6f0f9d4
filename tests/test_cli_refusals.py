"""Bad input to validate, bench, profile, workload and serve: one line and a non-zero exit, before any work,
and nothing lost (the cases of the second CLI audit; each was a traceback, a hang or a silent mistake)."""
from __future__ import annotations

import importlib
import json
import shutil

import pytest
from typer.testing import CliRunner

from planner.cli.app import app
from serve_helpers import save_byte_model


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def refused(result, message: str) -> None:
    """Exit 2 with one error line (after any progress line, e.g. serve's "loading ..."), no traceback."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert lines and lines[-1].startswith("error: ") and sum(x.startswith("error: ") for x in lines) == 1, lines
    assert "Traceback" not in result.stderr and message in lines[-1], lines


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_byte_model(tmp_path_factory.mktemp("model"))


@pytest.mark.parametrize("cv", ["1e308", "1e-200"])
def test_a_gamma_cv_whose_shape_is_no_number_is_refused(cv):
    refused(run("workload", "show", "sharegpt", "-n", 4, "--arrival", "gamma", "--cv", cv, "--rate", 1),
            "cv: must be a number from 1e-06 to 1e+06")


@pytest.mark.parametrize("command", [["bench", "--workload", "sharegpt", "--requests", 4],
                                     ["validate", "--gpu", "cpu", "--requests", 4, "--seeds", 0]])
def test_an_endpoint_that_is_no_url_is_refused(command, tmp_path):
    refused(run(*command, "--endpoint", "http://127.0.0.1:abc", "--out", tmp_path / "o"),
            "--endpoint 'http://127.0.0.1:abc': Invalid port: 'abc'; give a URL such as")


def test_more_requests_than_memory_holds_are_refused_by_bench_and_validate(tmp_path):
    huge = 10 ** 20
    refused(run("bench", "--endpoint", "http://127.0.0.1:1", "--model", "m", "--workload", "sharegpt",
                "--requests", huge, "--out", tmp_path / "b"), "requests are more than this machine's memory")
    refused(run("validate", "--gpu", "cpu", "--quick", "--seeds", 0, "--requests", huge, "--out", tmp_path / "v"),
            "requests are more than this machine's memory")
    refused(run("validate", "--gpu", "cpu", "--quick", "--seeds", 0, "--rate", "nan", "--out", tmp_path / "v"),
            "--rate must be a positive number of requests/s, got nan")


def test_run_folders_and_files_that_would_land_in_the_wrong_place_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    refused(run("bench", "--endpoint", "http://127.0.0.1:1", "--model", "m", "--workload", "sharegpt",
                "--requests", 2, "--out", ""), "--out '.': give a folder for the run's files, not the current one")
    (tmp_path / "d1").mkdir()
    for hist in ("", "d1", "lengths"):
        refused(run("workload", "show", "sharegpt", "-n", 4, "--hist", hist), "give a .png file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d1"]          # nothing written anywhere


def test_an_import_never_writes_over_its_own_input(tmp_path):
    src = tmp_path / "three.csv"
    src.write_text("request_id,arrival_time,prompt_len,output_len\na,0,5,5\nb,1,5,5\nc,2,5,5\n")
    before = src.read_text()
    refused(run("workload", "import", src, "-f", "csv", "-n", 1, "-o", src), "the file being imported")
    assert src.read_text() == before
    refused(run("workload", "import", src, "-f", "csv", "--duration", -1, "-o", tmp_path / "x.jsonl"),
            "--duration: must be a finite number of seconds > 0")
    refused(run("workload", "import", src, "-f", "csv", "--rate", 5, "--drop-zero", "-o", tmp_path / "x.jsonl"),
            "--rate, --drop-zero: not used with --format csv; drop them")


def test_bench_bounds_its_prompt_caps_and_vocabulary(tmp_path):
    base = ["bench", "--endpoint", "http://127.0.0.1:1", "--model", "m", "--workload", "sharegpt", "--requests", 2,
            "--out", tmp_path / "b"]
    refused(run(*base, "--max-prompt-len", 0), "max_prompt_len: must be >= 1, got 0")
    refused(run(*base, "--vocab-size", 10 ** 20), "--vocab-size must be 1 to 2,147,483,648")


def test_profile_repeats_are_bounded():
    result = run("profile", "--gpu", "cpu", "--quick", "--repeats", 10 ** 20)
    assert result.exit_code == 2 and "--repeats" in result.output


def test_a_checkpoint_that_is_not_one_is_named(folder, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    (broken / "model.safetensors").write_bytes(b"\xff" * 5000)
    refused(run("serve", "--model", broken, "--device", "cpu", "--port", 18999),
            f"{broken / 'model.safetensors'}: not a safetensors checkpoint")
    huge = tmp_path / "huge"
    shutil.copytree(folder, huge)
    config = json.loads((huge / "config.json").read_text())
    (huge / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 10 ** 20}))
    refused(run("serve", "--model", huge, "--device", "cpu", "--port", 18999),
            "num_hidden_layers is 100,000,000,000,000,000,000 but the checkpoint holds")


def test_serve_refuses_an_unknown_gpu_and_port_zero(folder):
    refused(run("serve", "--model", folder, "--device", "cpu", "--port", 18999, "--gpu", "bogus"),
            "unknown GPU 'bogus'")
    result = run("serve", "--model", folder, "--device", "cpu", "--port", 0)
    assert result.exit_code == 2 and "--port" in result.output


def test_a_failure_no_check_foresaw_is_one_line_with_its_name(monkeypatch, capsys):
    cli_app = importlib.import_module("planner.cli.app")
    def broken(**kwargs):
        raise ZeroDivisionError("float division by zero")
    monkeypatch.setattr(cli_app, "app", broken)
    monkeypatch.setattr("sys.argv", ["planner", "simulate"])
    monkeypatch.delenv("PLANNER_TRACEBACK", raising=False)
    with pytest.raises(SystemExit) as exit_:
        cli_app.main()
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert err == ("error: ZeroDivisionError: float division by zero (unexpected; PLANNER_TRACEBACK=1 shows "
                   "where)\n")
    monkeypatch.setenv("PLANNER_TRACEBACK", "1")
    with pytest.raises(ZeroDivisionError):
        cli_app.main()


def test_validate_refuses_flags_it_would_ignore(tmp_path):
    recording = tmp_path / "run.jsonl"
    recording.write_text('{"arrival_time": 0, "prompt_len": 8, "output_len": 4, "first_token_time": 0.1, '
                         '"finish_time": 0.4}\n')
    refused(run("validate", "--measured", recording, "--gpu", "cpu", "--workload", "alpaca", "--rate", 3,
                "--attribution", "--out", tmp_path / "v"),
            "--workload, --rate, --attribution: not used with --measured (the recording is the trace); drop them")
    refused(run("validate", "--gpu", "cpu", "--quick", "--served-model-name", "m", "--out", tmp_path / "w"),
            "--served-model-name: not used with the in-process engine")


def test_profile_refuses_what_an_ngram_measurement_ignores_and_names_a_bad_gpu_in_one_line(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"request_id": "a", "arrival_time": 0, "prompt_len": 3, "output_len": 2, '
                     '"prompt_token_ids": [1, 2, 3], "output_token_ids": [1, 2]}\n')
    refused(run("profile", "--speculative", "ngram:3", "--trace", trace, "--gpu", "h100-sxm", "--quick"),
            "--quick, --gpu: not used when measuring n-gram speculation on a trace")
    refused(run("profile", "--gpu", "bogus", "--quick"), "unknown GPU 'bogus'")


@pytest.mark.serial     # a live engine on the wall clock: run alone (scripts/test.sh)
def test_a_server_that_takes_connections_and_says_nothing_is_named_at_the_first_read():
    import socket

    from planner.errors import PlannerError
    from planner.validation.external import read_endpoint_settings
    with socket.socket() as listener:           # the kernel completes the handshake; nobody ever answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        port = listener.getsockname()[1]
        with pytest.raises(PlannerError, match=rf"127.0.0.1:{port}/metrics: no answer within 0.3 s"):
            read_endpoint_settings(f"http://127.0.0.1:{port}", timeout=0.3)


def test_validate_refuses_a_layout_the_simulation_would_refuse_before_the_live_run(tmp_path):
    result = run("validate", "--gpu", "cpu", "--model", "opt-125m", "--quick", "--enable-expert-parallel",
                 "--out", tmp_path / "v")
    refused(result, "--enable-expert-parallel: opt-125m has no experts to split")
    assert "live:" not in result.stderr                  # refused before the live run, not after it


@pytest.mark.parametrize("flag, value, message", [
    ("--cost-model", "abc", "--cost-model 'abc': choose one of"),
    ("--cost-model", "linear:x", "expected linear:A,B with two numbers"),
    ("--profile", "no-such-profile.json", "--profile no-such-profile.json: no such file"),
    ("--duration", "nan", "--duration must be a finite number of seconds > 0"),
    ("--node-link", "abc", "--node-link 'abc': unknown link"),
    ("--max-replicas", "-1", "--max-replicas must be >= 1"),
    ("--pd", "", "--pd: give P:D")])
def test_search_refuses_a_setting_of_every_configuration_before_it_starts(flag, value, message, tmp_path):
    # each was reported as every configuration's failure, and the search exited 0 as if it had run
    refused(run("search", "--model", "opt-125m", "--gpu", "a100", "--rate", 2, "-n", 20, "--slo", "ttft_p99=1",
                flag, value, "--out", tmp_path / "s"), message)


# --- the third audit (stop 91): each was an unexpected error, a message naming no file, or a silent mistake ---

def alone(result, message: str) -> None:
    """Refused with one line on stderr and nothing before it (no "searching ..." line first)."""
    refused(result, message)
    assert len(result.stderr.splitlines()) == 1, result.stderr


def test_a_model_config_no_parser_can_take_is_named(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    refused(run("simulate", "--model", tmp_path / "m", "--gpu", "h100", "-n", 5), "config.json: not valid JSON "
                                                                                  "(nested too deeply)")


def test_a_trace_path_that_is_no_file_says_what_it_is(tmp_path):
    (tmp_path / "dir.jsonl").mkdir()
    (tmp_path / "loop.jsonl").symlink_to(tmp_path / "loop.jsonl")
    refused(run("simulate", "--trace", tmp_path / "dir.jsonl"), "dir.jsonl: a folder, not a file")
    refused(run("simulate", "--trace", tmp_path / "loop.jsonl"), "loop.jsonl: a symbolic link to no file")


@pytest.mark.parametrize("duration", ["nan", "-1", "0"])
def test_a_trace_files_duration_is_checked_as_a_workloads_is(tmp_path, duration):
    # (it ran an empty simulation and exited 0)
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"arrival_time": 0, "prompt_len": 4, "output_len": 2}) + "\n")
    refused(run("simulate", "--trace", trace, "--duration", duration), "duration: must be a positive number")


@pytest.mark.parametrize("args, message", [
    (["capacity", "--tolerance", "0"], "tolerance must be in (0, 1)"),
    (["capacity", "--start-rate", "nan"], "<= start (nan) <="),
    (["search", "--rate", "1", "--price", "h100-sxm=nan"], "--price 'h100-sxm=nan'"),
    (["search", "--rate", "1", "--executor", "bogus"], "unknown executor 'bogus'"),
    (["simulate", "--concurrency", "1,0", "--gpu", "a100-80g"], "concurrency must be >= 1 clients, got 0"),
])
def test_a_search_refuses_its_own_settings_before_it_says_it_starts(tmp_path, args, message):
    alone(run(*args, "--model", "opt-125m", "--slo", "ttft_p99=1", "--requests", 10, "--out", tmp_path / "o"),
          message)


def test_from_vllm_runs_with_one_json_document_on_stdout_and_one_line_for_a_bad_option(tmp_path):
    serve, bench = "vllm serve facebook/opt-125m", "vllm bench serve --random-input-len 64 --num-prompts 5"
    ran = run("from-vllm", "--gpu", "h100", "--serve", serve, "--bench", bench, "--run", "--", "--json",
              "--out", tmp_path / "o")
    assert ran.exit_code == 0 and json.loads(ran.stdout)["num_submitted"] == 5, ran.output
    # (through main(), as the command line runs it: click's usage block was printed)
    import subprocess
    import sys
    bad = subprocess.run([sys.executable, "-c", "from planner.cli.app import main; main()", "from-vllm", "--gpu",
                          "h100", "--serve", serve, "--bench", bench, "--run", "--", "--bogus"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.splitlines()[-1].startswith("error: No such option: --bogus")
    assert "Usage" not in bad.stderr, bad.stderr


def test_two_runs_in_one_second_keep_their_own_folders(tmp_path, monkeypatch):
    from planner.cli.output import default_out
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("time.strftime", lambda fmt: "20261208-000000")
    first, second = default_out("sim", "sharegpt"), default_out("sim", "sharegpt")
    assert (first.name, second.name) == ("sim-20261208-000000-sharegpt", "sim-20261208-000000-sharegpt-2")
    assert first.is_dir() and second.is_dir()


def test_an_import_refuses_lengths_over_the_cap_before_any_work_and_writes_no_trace_it_would_refuse(tmp_path):
    from workloads import Trace, TraceError, TraceRequest
    (tmp_path / "any.json").write_text("[]")
    refused(run("workload", "import", tmp_path / "any.json", "--format", "conversations", "--tokenizer", tmp_path,
                "--output-len", 20_000_000, "-o", tmp_path / "t.jsonl"), "output_len: must be 1 to 10,000,000")
    late = Trace([TraceRequest(request_id="r", arrival_time=4e8, prompt_len=4, output_len=2)])
    with pytest.raises(TraceError, match=r"t\.jsonl: not written: request r's arrival_time 4e\+08 is over the cap"):
        late.save(tmp_path / "t.jsonl")
    assert not (tmp_path / "t.jsonl").exists()
