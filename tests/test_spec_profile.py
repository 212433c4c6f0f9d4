"""`planner profile --speculative ngram:K --trace FILE`: n-gram speculation measured on a trace's text
(issue 26, item 3), and the answer ids a trace carries for it."""
from __future__ import annotations

import json
import random

import pytest
from typer.testing import CliRunner

from engine.core.speculative import SpecDecodingStats, SpeculativeConfig, replay_ngram
from planner.cli.app import app
from workloads import Trace, TraceRequest

CONFIG = SpeculativeConfig("ngram", 4, 2, 3)


def test_an_answer_that_copies_its_prompt_is_drafted_and_accepted():
    prompt = list(range(100, 160))
    answer = [7, 8] + prompt[10:50]              # two fresh tokens, then a 40-token copy
    stats = SpecDecodingStats(4)
    replay_ngram(prompt, answer, CONFIG, stats)
    assert stats.num_drafts > 0 and stats.acceptance_rates()[0] == 1.0
    # Each verify step yields up to 5 tokens: the 40 copied tokens take far fewer than 40 lookups.
    assert stats.num_lookups < 20
    assert stats.draft_persistence() > 0.8
    assert stats.mean_acceptance_length > 4


def test_fresh_text_is_seldom_drafted():
    rng = random.Random(0)
    prompt = [rng.randrange(50_000) for _ in range(200)]
    answer = [rng.randrange(50_000) for _ in range(200)]
    stats = SpecDecodingStats(4)
    replay_ngram(prompt, answer, CONFIG, stats)
    # Tokens 2..199 are looked up (the first comes from the prefill; the last leaves no room for a draft).
    assert stats.num_lookups == 198 and stats.num_drafts == 0
    assert stats.draft_rates()[0] == 0.0


def test_the_measured_curves_reproduce_the_counts_in_the_simulator(tmp_path):
    """Measured on a trace, the curves given to simulate draw drafts at the measured rates."""
    rng = random.Random(1)
    reqs = []
    for i in range(30):
        prompt = [rng.randrange(1000) for _ in range(120)]
        start = rng.randrange(60)
        answer = [rng.randrange(1000) for _ in range(10)] + prompt[start:start + 40] + [rng.randrange(1000)
                                                                                      for _ in range(30)]
        reqs.append(TraceRequest(request_id=f"r{i}", arrival_time=0.1 * i, prompt_len=120, output_len=len(answer),
                                 prompt_token_ids=prompt, output_token_ids=answer))
    path = tmp_path / "copying.jsonl"
    Trace(name="copying", requests=reqs).save(path)
    assert Trace.load(path).requests[0].output_token_ids == reqs[0].output_token_ids     # saved and read back
    result = CliRunner().invoke(app, ["profile", "--speculative", "ngram:4", "--trace", str(path), "--json"])
    assert result.exit_code == 0, result.output
    measured = json.loads(result.stdout)
    flags = measured["flags"]
    assert flags[:2] == ["--speculative", "ngram:4"] and "--draft-persistence" in flags
    sim = CliRunner().invoke(app, ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--trace", str(path),
                                   "--json", "--out", str(tmp_path / "sim"), *flags])
    assert sim.exit_code == 0, sim.output
    stats = json.loads(sim.stdout)["spec_decoding_stats"]
    assert stats["num_drafts"] / stats["num_lookups"] == pytest.approx(
        measured["num_drafts"] / measured["num_lookups"], abs=0.1)
    assert stats["mean_acceptance_length"] == pytest.approx(measured["mean_acceptance_length"], rel=0.15)


@pytest.mark.parametrize("args,message", [
    (["--speculative", "ngram:4"], "--trace"),
    (["--speculative", "eagle:3", "--trace", "TRACE"], "n-gram"),
    (["--speculative", "ngram:4", "--trace", "TRACE"], "answers' token ids"),
    (["--speculative", "ngram:4", "--trace", "missing.jsonl"], "missing.jsonl"),
])
def test_what_cannot_be_measured_is_one_line(args, message, tmp_path):
    path = tmp_path / "plain.jsonl"
    Trace(name="plain", requests=[TraceRequest(request_id="a", arrival_time=0, prompt_len=5, output_len=5)]).save(path)
    args = [str(path) if a == "TRACE" else a for a in args]
    result = CliRunner().invoke(app, ["profile", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_answer_ids_must_match_the_output_length():
    with pytest.raises(ValueError, match="output_len"):
        TraceRequest(request_id="a", arrival_time=0, prompt_len=2, output_len=3, output_token_ids=[1, 2])


@pytest.mark.serial     # a live engine on the wall clock: run alone (scripts/test.sh)
def test_validate_simulates_with_the_curves_the_live_run_measured():
    """validate --speculative ngram:K: the live counters become the deployment's three curves, which the
    simulator's proposer then draws from (those given on the command line win)."""
    from engine.deployment import Deployment
    from planner.deploy.speculation import speculation_of
    from planner.validation.live import speculation_curves
    stats = SpecDecodingStats(4)
    prompt = list(range(100, 140))
    replay_ngram(prompt, [9] + prompt[5:30] + [7, 8, 9], CONFIG, stats)
    curves = speculation_curves(stats.as_dict())
    assert set(curves) == {"acceptance", "draft_rates", "draft_persistence"}
    spec = speculation_of(Deployment(model="opt-125m", speculative="ngram:4", **curves))
    assert spec.acceptance == pytest.approx(tuple(stats.acceptance_rates()), abs=1e-5)
    assert spec.drafting == pytest.approx(tuple(stats.draft_rates()), abs=1e-5)
    assert spec.persistence == pytest.approx(stats.draft_persistence(), abs=1e-5)
    assert speculation_curves(None) == {}
