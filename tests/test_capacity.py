"""The capacity report's lines (planner/sizing/capacity.py)."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from engine.deployment import Deployment
from dataclasses import replace

from engine.core.metrics import slo_attainment
from planner import capacity, simulate
from planner.cli.app import app
from planner.errors import PlannerError
from planner.runs.slos import meets
from planner.runs.spec import RunSpec
from planner.sizing.capacity import _binding_line


@pytest.fixture(scope="module")
def small_capacity():
    def run(attainment):
        return capacity(Deployment(model="opt-13b", gpu="a100-40g"), slos="ttft_p99=0.08,tpot_p99=0.05",
                        slo_attainment=attainment, workload="alpaca", requests=200, tolerance=0.05)
    return run


def test_the_binding_line_does_not_round_a_miss_onto_its_limit():
    """0.010509 against a 0.0105 limit read "reached 0.0105" at 3 digits: one more says it passed it."""
    line = _binding_line("tpot_p99", {"tpot_p99": 0.0105}, "45.6 req/s", {"tpot_p99": 0.010509})
    assert line == "Binding limit: tpot_p99 <= 0.0105 (at 45.6 req/s it reached 0.01051)."
    assert _binding_line("ttft_p99", {"ttft_p99": 2}, "8 req/s", {"ttft_p99": 2.6789}).endswith("reached 2.68).")


def test_slo_attainment_counts_requests_within_every_limit():
    """Judged by attainment, a rejected request is a miss (not a failed run), and a run that piles up fails."""
    doc = {"num_submitted": 100, "num_good": 91, "num_rejected": 2, "ttft_p99": 9.0, "verdict": {}}
    assert meets(doc, {"ttft_p99": 0.5}, attainment=0.9)
    assert not meets(doc, {"ttft_p99": 0.5}, attainment=0.92)
    assert not meets(doc, {"ttft_p99": 0.5})                  # by the statistic (and a rejection fails it)
    assert not meets({**doc, "verdict": {"overloaded": True}}, {"ttft_p99": 0.5}, attainment=0.5)
    assert not meets({"num_submitted": 10, "verdict": {}}, {"ttft_p99": 0.5}, attainment=0.5)   # judged without SLOs


def test_capacity_by_slo_attainment(small_capacity):
    loose, strict = (small_capacity(attainment) for attainment in (0.5, 0.99))
    for found, target in ((loose, 0.5), (strict, 0.99)):
        doc = found.document
        assert doc["slo_attainment"] == target and doc["binding_slo"] == "slo_attainment"
        assert all(p["attainment"] >= target for p in doc["probes"] if p["meets"])
        first_miss = min((p for p in doc["probes"] if not p["meets"]), key=lambda p: p["rate"])
        assert first_miss["rate"] > found.rate and first_miss["attainment"] < target
        assert any(line.startswith("Binding limit: SLO attainment >= ") for line in doc["verdict"]["lines"])
    assert strict.rate < loose.rate         # the stricter share is met only at a lower rate
    assert "--slo-attainment 0.99" in strict.spec.command(capacity=True)
    # the run at capacity, as its "Next:" line repeats it, meets the share it was found by
    at = simulate(replace(strict.spec, load=replace(strict.spec.load, rate=strict.rate,
                                                    requests=strict.document["at_capacity"]["num_submitted"])))
    judged = at.verdict["slo_attainment"]
    assert strict.document["verdict"]["next_command"].endswith("--slo-attainment 0.99")
    assert judged["target"] == 0.99 and judged["met"] and judged["share"] == slo_attainment(at.document())
    assert any(line.startswith("SLO attainment met: ") for line in at.verdict["lines"])


def test_slo_attainment_is_a_share():
    with pytest.raises(PlannerError, match="--slo-attainment 1.5: give the share of requests"):
        RunSpec(slo_attainment=1.5)
    result = CliRunner().invoke(app, ["capacity", "--model", "opt-125m", "--gpu", "a100-40g", "--slo", "0.2",
                                      "--slo-attainment", "0"])
    assert result.exit_code == 2 and result.output.startswith("error: --slo-attainment 0: give the share")
    result = CliRunner().invoke(app, ["simulate", "--model", "opt-125m", "--gpu", "a100-40g",
                                      "--slo-attainment", "0.9"])
    assert result.exit_code == 2 and "--slo-attainment judges the share of requests within the --slo limits" in \
        result.output


def test_a_capacity_whose_requests_cannot_run_at_any_rate_says_so_after_one_probe(tmp_path):
    # Every request needs more than the whole KV cache (20 + 8 tokens: two blocks of 16 when done, and a third
    # free before its last decode): its lengths, not its rate, reject it, so halving the rate down to the lowest
    # would replay the same refusals; the one probe says so, and what to change.
    result = CliRunner().invoke(app, ["capacity", "--model", "opt-125m", "--gpu", "a100-40g", "--policy", "paper",
                                      "--num-gpu-blocks", "2", "--max-model-len", "32", "--workload", "random",
                                      "-p", "input_len=20", "-p", "output_len=8", "--slo", "ttft_p99=2",
                                      "--out", str(tmp_path / "kv"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["capacity_rate"] is None and [p["rate"] for p in doc["probes"]] == [1.0]
    lines = doc["verdict"]["lines"]
    assert lines[0].startswith("No capacity: every request was rejected at 1 req/s, as it would be at any rate (")
    assert "needs more KV cache than the whole cache holds" in lines[0]
    assert doc["verdict"]["next_command"].startswith("planner capacity") and "--tp 2" in doc["verdict"]["next_command"]
    assert (tmp_path / "kv" / "capacity.png").stat().st_size > 0      # panels with no value plot too
    # some requests served (truncated at a context limit of the run's own), the rest rejected: the search
    # goes on, and the remedy is the model's own context, not more GPUs
    own = capacity(Deployment(model="opt-125m", gpu="a100-40g", max_model_len=8), slos="ttft_p99=2",
                   workload="sharegpt", requests=100)
    assert own.rate is None and len(own.document["probes"]) > 1
    assert own.document["verdict"]["next_command"] == own.spec.command(capacity=True, max_model_len=None)


def test_a_probe_that_serves_nothing_after_a_good_one_is_only_a_miss():
    from planner.sizing.capacity import search_capacity
    from planner.sizing.probe import Probe

    def probe(rate):       # meets the SLOs up to 3 req/s, rejects everything above (not a real engine's way)
        doc = {"num_submitted": 10, "num_rejected": 0 if rate <= 3 else 10}
        return Probe(rate, rate <= 3, doc)
    found = search_capacity(probe, start=1.0, min_rate=0.01, max_rate=64.0, rel_tol=0.05)
    assert 2.85 <= found.rate <= 3 < found.bad and found.bounded
    nothing = search_capacity(lambda rate: Probe(rate, False, {"num_submitted": 5, "num_rejected": 5}),
                              start=1.0, min_rate=0.01, max_rate=64.0, rel_tol=0.05)
    assert nothing.rate is None and len(nothing.probes) == 1


def test_prompts_past_the_models_own_context_leave_no_command_to_run(tmp_path):
    trace = tmp_path / "long.jsonl"
    trace.write_text("".join(json.dumps({"request_id": f"r{i}", "arrival_time": i, "prompt_len": 3000,
                                         "output_len": 8}) + "\n" for i in range(20)))
    found = capacity(Deployment(model="opt-125m", gpu="a100-40g"), slos="ttft_p99=2", workload=str(trace))
    assert found.rate is None and len(found.document["probes"]) == 1
    assert found.document["verdict"]["next_command"] is None
    assert found.document["verdict"]["lines"][-1].startswith("No setting of this run admits its requests")
