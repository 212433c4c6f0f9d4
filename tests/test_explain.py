"""`planner explain`: one step's ledger, from the same deployment options as every command."""

import json

import pytest
from typer.testing import CliRunner

from planner.cli.app import app
from planner.cost.measured import MeasuredCostModel
from planner.cost.shape import StepShape, context_histogram, prefill_attn_pairs

QWEN = ["explain", "--model", "Qwen/Qwen3-32B", "--gpu", "h100-sxm", "--tp", "2", "--max-model-len", "8192"]


def run(*args):
    return CliRunner().invoke(app, [*QWEN, *args])


def test_prints_every_term_with_its_share_and_source():
    result = run("--batch", "9", "--context", "1100")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "9 decodes at 1100 tokens (9 tokens, run as 16)" in out
    for term in ("qkv GEMM", "attention (decode)", "SiLU and mul", "all-reduce", "LM head GEMM", "sampler",
                 "host: schedule, inputs, outputs", "total"):
        assert term in out
    assert "table" in out and "roofline" in out and "fitted" in out and "100.0%" in out
    assert "CUDA graphs up to 512 tokens" in out and "hidden behind the GPU's" in out   # vLLM's default: async
    serial = run("--batch", "9", "--context", "1100", "--no-async-scheduling").output
    assert "host time in series with the GPU" in serial


def test_json_ledger_is_the_models_step_time():
    result = run("--batch", "32", "--context", "2000", "--prefill-tokens", "700", "--prefill-context", "300",
                 "--no-async-scheduling", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    model = MeasuredCostModel("qwen3-32b", "h100-sxm", tp=2, async_scheduling=False,
                              max_num_batched_tokens=8192, max_num_seqs=256)
    shape = StepShape(prefill_seqs=1, prefill_tokens=700, prefill_attn_pairs=prefill_attn_pairs(700, 300),
                      decode_seqs=32, decode_context=64000, decode_histogram=context_histogram([2000] * 32))
    assert doc["total_seconds"] == pytest.approx(model.step_time(shape), rel=1e-12)
    assert sum(t["seconds"] for t in doc["terms"]) == pytest.approx(doc["total_seconds"], rel=1e-12)
    assert {t["term"] for t in doc["terms"]} >= {"attention (prefill)", "attention (decode)", "logits all-gather"}
    assert doc["tokens"] == doc["padded_tokens"] == 732                     # past 512: eager, no padding


def test_deployment_flags_reach_the_ledger():
    default = run("--batch", "20", "--prefill-tokens", "61", "--json")       # graphs up to 512 tokens
    small = run("--batch", "20", "--prefill-tokens", "61", "--max-num-seqs", "32", "--json")   # up to 64
    assert small.exit_code == 0, small.output
    assert json.loads(default.output)["padded_tokens"] == 88 and json.loads(small.output)["padded_tokens"] == 81
    fp8 = run("--batch", "8", "--quantization", "fp8", "--json")
    assert "gemm_fp8" in " ".join(t["detail"] for t in json.loads(fp8.output)["terms"])


@pytest.mark.parametrize("args, message", [
    ([*QWEN, "--batch", "0"], "nothing to explain"),
    ([*QWEN, "--batch", "-3"], "must be >= 0"),
    ([*QWEN, "--batch", "4", "--tp", "2,4"], "takes one value"),
    (["explain", "--model", "opt-125m", "--gpu", "cpu", "--batch", "4"], "no measured vLLM data"),
    ([*QWEN, "--batch", "4", "--context", "9000"], "longer than the deployment's max_model_len 8192"),
    ([*QWEN, "--batch", "1", "--prefill-tokens", "8000", "--prefill-context", "1000"], "a sequence of 9000 tokens"),
    # steps vLLM's scheduler never forms on this deployment, refused before a list of 1e11 contexts is built
    ([*QWEN, "--batch", "99999999999"], "more than max_num_seqs 1024: vLLM never schedules more"),
    ([*QWEN, "--batch", "40", "--max-num-seqs", "40", "--prefill-tokens", "100"], "41 sequences in one step"),
    ([*QWEN, "--batch", "100", "--prefill-tokens", "8100"], "8200 new tokens in one step, more than the token "
                                                            "budget 8192"),
    ([*QWEN, "--batch", "1000", "--context", "8000"], "the step's 8,000,000 cached tokens are more than the"),
    ([*QWEN, "--batch", "4", "--tp", "99999999999"], "tensor parallel size 99999999999 (--tp) does not split"),
])
def test_bad_input_is_one_line(args, message):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output


def test_the_ledger_carries_the_warnings_simulate_gives():
    result = CliRunner().invoke(app, ["explain", "--model", "qwen3-30b-a3b", "--gpu", "h100-sxm", "--batch", "8",
                                      "--all2all-backend", "deepep_low_latency", "--enable-dbo", "--json"])
    assert result.exit_code == 0, result.output
    notes = json.loads(result.output)["notes"]
    assert any(n.startswith("warning: --all2all-backend deepep_low_latency and --enable-dbo change nothing")
               for n in notes)
