"""planner validate: the live engine and the simulator make the same decisions on the same trace."""
from __future__ import annotations

import json
import math

import pytest

from planner.validate import ValidateConfig, validate
from planner.validate_report import write_report
from tiny_models import save_tiny_model


class ConstantCost:
    name = "constant(10ms)"

    def step_time(self, shape) -> float:
        return 0.01


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("llama"))


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_simulator_predicts_the_live_preemptions_under_memory_pressure(llama_dir, tmp_path, mode):
    # All requests at t=0: scheduling no longer depends on step times, so the
    # simulator must reproduce the engine's decisions exactly.
    cfg = ValidateConfig(model=llama_dir, workload="alpaca", rate=math.inf, requests=10, length_scale=1.0,
                         max_prompt_len=40, max_output_len=30, block_size=8, num_gpu_blocks=12,
                         preemption_mode=mode, max_num_seqs=8)
    v = validate(cfg, cost_model=ConstantCost())
    live, sim = v.live.metrics, v.simulated
    assert live["num_completed"] == sim["num_completed"] == 10
    assert live["preemptions"][mode] > 0
    assert live["preemptions"] == sim["preemptions"]
    assert [s.batch_size for s in v.live.steps] == [s.batch_size for s in v.sim_steps]
    assert [s.kv_blocks_used for s in v.live.steps] == [s.kv_blocks_used for s in v.sim_steps]
    assert len(v.step_errors) == len(v.live.steps)

    report = write_report(v, tmp_path / "report")
    doc = json.loads((tmp_path / "report" / "comparison.json").read_text())
    assert doc["comparison"]["preemptions"]["relative_error"] == 0
    assert doc["comparison"]["mean_batch_size"]["relative_error"] == 0
    text = report.read_text()
    assert "| request_throughput |" in text and "timeline.png" in text
    assert (tmp_path / "report" / "latency_cdf.png").stat().st_size > 0


def test_missing_profile_is_a_clear_error(llama_dir, tmp_path):
    from planner.errors import PlannerError
    cfg = ValidateConfig(model=llama_dir, requests=2, profile=str(tmp_path / "none.json"))
    with pytest.raises(PlannerError, match="no profile at"):
        validate(cfg)


def test_cli_calibrates_then_validates_and_prints_one_json_document(llama_dir, tmp_path):
    from typer.testing import CliRunner

    from planner.cli import app
    result = CliRunner().invoke(app, ["validate", "--model", llama_dir, "--workload", "alpaca", "--requests", "6",
                                      "--rate", "50", "--length-scale", "0.5", "--reprofile",
                                      "--out", str(tmp_path / "run"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["cost_model"].startswith("calibrated(") and (tmp_path / "run" / "profile.json").exists()
    assert doc["num_completed"] == {"measured": 6, "simulated": 6}
    assert (tmp_path / "run" / "report.md").exists() and (tmp_path / "run" / "report.html").exists()
    assert doc["verdict"]["lines"] and "within_targets" in doc["verdict"]
    assert json.loads((tmp_path / "run" / "comparison.json").read_text())["verdict"] == doc["verdict"]


def test_cli_bad_input_is_one_line_and_exit_2(llama_dir, tmp_path):
    from typer.testing import CliRunner

    from planner.cli import app
    result = CliRunner().invoke(app, ["validate", "--model", llama_dir, "--gpu", "a100", "--requests", "2",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert "no CUDA device" in result.stderr
