"""scripts/gpu_check.sh: its arguments and summary here; the whole dry run (minutes) is marked slow."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def test_bad_argument_is_a_one_line_error():
    result = subprocess.run(["bash", str(SCRIPT), "--bogus"], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip() == "gpu_check: unknown argument --bogus (see --help)"


def test_summary_reads_the_steps_and_checks_validate_against_the_targets(tmp_path):
    (tmp_path / "steps.tsv").write_text("build\t0\t80\nparity\t0\t20\nvalidate-opt-1.3b\t0\t60\n"
                                        "measured-cost-model-opt-1.3b\tabsent\t0\n")
    (tmp_path / "parity.json").write_text(json.dumps({"results": [
        {"dtype": "float32", "identical": 8, "sequences": 8, "passed": True},
        {"dtype": "bfloat16", "identical": 7, "sequences": 8, "passed": True}]}))
    doc = {"cost_model": "calibrated", "kernels": "cuda", "per_step_error": {"median_abs": 0.02},
           "comparison": {"output_token_throughput": {"relative_error": -0.021},
                          "e2e_mean": {"relative_error": 0.07}}}
    (tmp_path / "validate-opt-1.3b.log").write_text("validate: live run first\n" + json.dumps(doc) + "\n")
    (tmp_path / "measured-cost-model-opt-1.3b.log").write_text("the measured-op cost model is not in this build\n")
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check_summary.py"), str(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    validate = summary["validate-opt-1.3b"]
    assert validate["throughput_within_3pct"] is True and validate["e2e_within_5pct"] is False
    assert summary["parity"]["bfloat16"] == {"identical": 7, "sequences": 8, "passed": True}
    assert summary["measured-cost-model-opt-1.3b"] == ["the measured-op cost model is not in this build"]
    (tmp_path / "steps.tsv").write_text("build\t1\t80\n")
    failed = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check_summary.py"), str(tmp_path)],
                            capture_output=True, text=True)
    assert failed.returncode == 1


@pytest.mark.slow
def test_dry_run_exercises_every_step_on_the_cpu(tmp_path):
    out = tmp_path / "gpu-check"
    result = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--out", str(out)], capture_output=True, text=True,
                            cwd=ROOT, timeout=1800)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dry_run"] is True
    assert {s["step"] for s in summary["steps"]} >= {"env", "build", "gpu-tests", "decode-bandwidth", "parity",
                                                    "profile-opt-tiny", "profile-llama-tiny", "validate-opt-tiny"}
    assert all(s["status"] in ("0", "absent") for s in summary["steps"])
    assert set(summary["decode_bandwidth"]) >= {"mha", "gqa"}
    assert summary["parity"]["float32"]["passed"]
    assert summary["profiles"] == ["cpu-llama-tiny.json", "cpu-opt-tiny.json"]
