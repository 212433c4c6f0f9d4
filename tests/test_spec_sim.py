"""Speculative decoding in the simulator and the planner's flags (issue 26, items 3 and 4).

The simulator runs the engine scheduler's own speculation (lookahead slots, budget, trim) with
placeholder drafts whose acceptance is drawn per position from a curve (planner/sim/speculative.py).
"""
from __future__ import annotations

import json
from collections import Counter

import pytest
from typer.testing import CliRunner

from engine.deployment import Deployment
from planner.catalog import resolve_gpu, resolve_model
from planner.cli.app import app
from planner.cost.measured import MeasuredCostModel
from planner.errors import PlannerError
from planner.sim import simulate
from planner.deploy.speculation import EAGLE_LLAMA31_8B_MTBENCH, Speculation, _run_length, speculation_of
from planner.sim.speculative import STRATA, StratifiedUniforms
from sim_helpers import sim_plan
from workloads import Trace, TraceRequest, make_trace

LLAMA, H100 = resolve_model("llama-3.1-8b"), resolve_gpu("h100-sxm")
MEASURED = MeasuredCostModel(LLAMA, H100)
POLICIES = ("paper", "vllm-v1")


def fixed_trace(n: int, prompt: int, output: int, spread: int = 0) -> Trace:
    """`n` requests at time 0 (a schedule that does not depend on step times); lengths vary by `spread`."""
    reqs = [TraceRequest(request_id=f"r{i}", arrival_time=0.0, prompt_len=prompt + (37 * i) % (spread + 1),
                         output_len=output + (53 * i) % (spread + 1)) for i in range(n)]
    return Trace(name="fixed-test", requests=reqs)


def run(trace, concurrency=None, seed=0, **knobs):
    plan = sim_plan(LLAMA, H100, max_model_len=4096, **knobs)
    return simulate(trace, plan, MEASURED, seed=seed, concurrency=concurrency)


def decode_steps(result) -> int:
    return sum(1 for s in result.shapes if s.prefill_tokens == 0 and s.decode_seqs)


@pytest.mark.parametrize("policy", POLICIES)
def test_off_is_identical_to_no_setting(policy):
    trace = make_trace("sharegpt", num_requests=60, rate=8.0, seed=3)
    plain = run(trace, policy=policy)
    off = run(trace, policy=policy, speculative="none")
    assert off.plan.deployment == plain.plan.deployment
    assert plain.steps == off.steps and plain.summary() == off.summary()
    assert "spec_decoding_stats" not in plain.summary() and plain.spec_decoding is None
    assert plain.fast_forwarded_steps > 0          # fast-forward still on when speculation is off


@pytest.mark.parametrize("policy", POLICIES)
def test_full_acceptance_gives_k_plus_one_tokens_per_verify_step(policy):
    k, output = 4, 201
    trace = fixed_trace(4, 100, output)
    plain = run(trace, concurrency=1, policy=policy)
    spec = run(trace, concurrency=1, policy=policy, speculative=f"ngram:{k}", acceptance="1,1,1,1")
    stats = spec.spec_decoding
    assert stats["num_draft_tokens"] == stats["num_accepted_tokens"]          # every draft accepted
    assert stats["mean_acceptance_length"] == pytest.approx(k + 1)
    assert all(r.output_len == output for r in spec.requests)
    # 200 tokens after the prompt's: 40 verify steps of 5 per request, against 200 plain decodes.
    assert decode_steps(plain) == 4 * (output - 1)
    assert decode_steps(spec) == 4 * (output - 1) // (k + 1)
    for shape in spec.shapes:                      # each verify step: one sequence, k + 1 tokens
        if shape.prefill_tokens == 0 and shape.decode_seqs:
            assert (shape.decode_seqs, shape.draft_tokens, shape.total_tokens) == (1, k, k + 1)
    assert spec.metrics.tpot_mean < plain.metrics.tpot_mean / 2


@pytest.mark.parametrize("policy", POLICIES)
def test_zero_acceptance_gives_one_token_per_step_and_leaks_no_blocks(policy):
    # All at time 0 and a budget the drafts never bind: the same schedule whatever the prices.
    trace = fixed_trace(40, 200, 100, spread=300)
    plain = run(trace, policy=policy, max_num_batched_tokens=32768)
    spec = run(trace, policy=policy, max_num_batched_tokens=32768, speculative="ngram:3", acceptance="0,0,0")
    stats = spec.spec_decoding
    assert stats["num_accepted_tokens"] == 0 and stats["mean_acceptance_length"] == 1
    assert stats["num_drafts"] > 0
    assert [r.output_len for r in spec.requests] == [r.output_len for r in plain.requests]
    assert decode_steps(spec) == decode_steps(plain)
    assert spec.kv_blocks_used_at_end == plain.kv_blocks_used_at_end      # (vllm-v1 keeps its null block)
    # Rejected drafts' slots are given back: every step holds what it holds without speculation
    # plus only its own drafts' lookahead slots (its extra decode rows), at most one block each.
    assert len(spec.steps) == len(plain.steps)
    for a, b, sa, sb in zip(spec.steps, plain.steps, spec.shapes, plain.shapes):
        assert sa.decode_seqs == sb.decode_seqs
        assert a.token_states - b.token_states == sa.draft_tokens
        assert b.kv_blocks_used <= a.kv_blocks_used <= b.kv_blocks_used + a.num_seqs


@pytest.mark.parametrize("policy", POLICIES)
def test_mean_acceptance_length_matches_the_curve(policy):
    curve = (0.8, 0.6, 0.5, 0.3)
    trace = fixed_trace(16, 64, 1500)
    spec = run(trace, concurrency=16, policy=policy, speculative="ngram:4", acceptance=",".join(map(str, curve)))
    stats = spec.spec_decoding
    expected = Speculation("ngram", 4, curve, "test").expected_acceptance_length()
    assert stats["expected_mean_acceptance_length"] == pytest.approx(expected)
    n = stats["num_drafts"]
    assert n > 3000
    # Accepted drafts per verify step have a standard deviation below 1.2: four standard errors.
    assert abs(stats["mean_acceptance_length"] - expected) < 4 * 1.2 / n ** 0.5 + 0.01
    assert stats["acceptance_rate_per_pos"][0] == pytest.approx(0.8, abs=4 * 0.4 / n ** 0.5 + 0.01)


def test_one_uniform_per_draw_has_the_curves_law():
    """`_run_length` inverts the run's law: over an even grid of uniforms each run length comes up as
    often as position-by-position draws would give it."""
    rates = (0.8, 0.6, 0.5, 0.3)
    grid = [(i + 0.5) / 10_000 for i in range(10_000)]
    for most in (4, 2):
        counts = Counter(_run_length(u, rates, most) for u in grid)
        reach = [1.0, 0.8, 0.48, 0.24, 0.072][:most + 1] + [0.0]
        for length in range(most + 1):
            assert counts[length] / len(grid) == pytest.approx(reach[length] - reach[length + 1], abs=2e-4)


def test_stratified_uniforms_cover_every_slice_once_per_block():
    draw = StratifiedUniforms(7)
    for _ in range(3):
        block = [draw() for _ in range(STRATA)]
        assert sorted(int(u * STRATA) for u in block) == list(range(STRATA))
    assert StratifiedUniforms(7)() == StratifiedUniforms(7)() != StratifiedUniforms(8)()


def test_a_short_run_accepts_as_the_curve_says_whatever_the_seed():
    """A validation-sized run (about 300 verify steps) lands within 1.5% of the curve's mean acceptance
    length on every seed: the draws are stratified. Independent draws missed it by up to 5% (10 seeds)."""
    curve = (0.8, 0.6, 0.5, 0.3)
    expected = Speculation("ngram", 4, curve, "test").expected_acceptance_length()
    for seed in range(10):
        stats = run(fixed_trace(4, 64, 200), concurrency=4, seed=seed, speculative="ngram:4",
                    acceptance=",".join(map(str, curve))).spec_decoding
        assert stats["num_drafts"] > 250
        assert stats["mean_acceptance_length"] == pytest.approx(expected, rel=0.015)


def test_drafting_curve_and_persistence_are_what_the_simulator_draws():
    """--draft-rates and --draft-persistence: the simulated proposer drafts as the curves say, and the
    counters it keeps (the engine's own) measure them back: the loop validate closes with a live run."""
    rates, persistence = (0.3, 0.8, 0.5), 0.9
    trace = fixed_trace(16, 64, 1200)
    spec = run(trace, concurrency=16, speculative="ngram:3", acceptance="1,1,1", draft_rates="0.3,0.8,0.5",
               draft_persistence=persistence)
    stats = spec.spec_decoding
    n = stats["num_lookups"]
    assert n > 2000
    assert stats["draft_persistence"] == pytest.approx(persistence, abs=0.03)
    for measured, given in zip(stats["draft_rates"], rates):
        assert measured == pytest.approx(given, abs=0.05)
    # Persistence makes drafts come in runs: far more drafts than the first rate alone would give.
    assert stats["num_drafts"] / n > 0.6
    memoryless = run(trace, concurrency=16, speculative="ngram:3", acceptance="1,1,1", draft_rates="0.3,0.8,0.5")
    assert memoryless.spec_decoding["num_drafts"] / memoryless.spec_decoding["num_lookups"] == pytest.approx(
        0.3, abs=0.04)
    # Fewer drafts, fewer tokens per step: the run is slower than drafting every step.
    always = run(trace, concurrency=16, speculative="ngram:3", acceptance="1,1,1")
    assert always.metrics.tpot_mean < spec.metrics.tpot_mean < memoryless.metrics.tpot_mean


def test_draft_model_speculation_is_priced_by_the_draft_models_own_steps():
    """--speculative draft:K --draft-model M: M's weights and KV share the GPU (fewer blocks), its passes
    add to each step; a small draft pays at light load, the target drafting for itself never does."""
    trace = fixed_trace(4, 200, 300)
    plain = run(trace, concurrency=1)
    small = run(trace, concurrency=1, speculative="draft:3", draft_model="llama-3.2-1b", acceptance="0.8,0.7,0.6")
    itself = run(trace, concurrency=1, speculative="draft:3", draft_model="llama-3.1-8b", acceptance="0.8,0.7,0.6")
    assert small.metrics.tpot_mean < plain.metrics.tpot_mean < itself.metrics.tpot_mean
    assert 0 < small.spec_decoding["proposer_seconds"] < itself.spec_decoding["proposer_seconds"]
    with_draft, alone = small.plan.memory, plain.plan.memory
    assert with_draft.num_gpu_blocks < alone.num_gpu_blocks
    assert with_draft.weight_bytes_per_gpu - alone.weight_bytes_per_gpu == pytest.approx(
        resolve_model("llama-3.2-1b").weight_bytes_per_gpu(1, 2), rel=0.01)


def test_an_eagle_or_mtp_head_is_one_layer_sharing_the_targets_vocabulary():
    """EAGLE and MTP heads: one decoder layer of the target's width whose weights and KV share the GPU
    (the embedding and LM head are the target's), its passes priced by the same cost model: the
    first over the step's tokens, then k - 1 more, each with its LM head over the target's vocabulary."""
    from planner.deploy.speculation import proposer_model
    head, shares = proposer_model(Deployment(model="llama-3.1-8b", speculative="eagle:3"), LLAMA)
    assert shares and head.num_layers == 1 and head.hidden_size == LLAMA.hidden_size
    assert head.vocab_size == LLAMA.vocab_size
    moe = resolve_model("qwen3-30b-a3b")
    assert not proposer_model(Deployment(model="qwen3-30b-a3b", speculative="eagle:2"), moe)[0].is_moe
    assert proposer_model(Deployment(model="qwen3-30b-a3b", speculative="mtp:1"), moe)[0].is_moe
    # every catalog model takes an EAGLE head (a Llama layer, whatever the target's attention) and, but for
    # DeepSeek-V4 (its MTP layer's compressed kind is not in the catalog: refused in a line), an MTP head
    from planner.catalog import list_models
    for target in list_models():
        assert proposer_model(Deployment(model=target.name, speculative="eagle:1"), target)[0].model_type == "llama"
        if target.compressed_attention is None:
            assert proposer_model(Deployment(model=target.name, speculative="mtp:1"), target)[0].num_layers == 1
        else:
            with pytest.raises(PlannerError, match=f"--speculative mtp on {target.name}: its MTP layer's"):
                proposer_model(Deployment(model=target.name, speculative="mtp:1"), target)
    trace = fixed_trace(4, 200, 300)
    plain = run(trace, concurrency=1)
    eagle = run(trace, concurrency=1, speculative="eagle:3", acceptance="0,0,0")
    layer = (eagle.plan.memory.weight_bytes_per_gpu - plain.plan.memory.weight_bytes_per_gpu)
    assert layer == pytest.approx(LLAMA.linear_params / LLAMA.num_layers * 2, rel=0.01)
    assert eagle.plan.memory.num_gpu_blocks < plain.plan.memory.num_gpu_blocks
    # Nothing accepted: one token per step, each step dearer by the head's three passes, which read at
    # least its LM head's weights each and cost less than a target step.
    steps = sum(1 for s in eagle.shapes if s.prefill_tokens == 0 and s.decode_seqs)
    per_step = eagle.spec_decoding["proposer_seconds"] / steps
    lm_head_read = LLAMA.vocab_size * LLAMA.hidden_size * 2 / H100.memory_bandwidth
    assert 3 * lm_head_read < per_step < plain.metrics.tpot_mean
    assert eagle.metrics.tpot_mean > plain.metrics.tpot_mean


def test_deterministic_per_seed():
    trace = make_trace("sharegpt", num_requests=30, rate=10.0, seed=2)
    one = run(trace, seed=5, speculative="eagle:3")
    again = run(trace, seed=5, speculative="eagle:3")
    other = run(trace, seed=6, speculative="eagle:3")
    assert one.summary() == again.summary()
    assert one.spec_decoding["num_accepted_tokens_per_pos"] != other.spec_decoding["num_accepted_tokens_per_pos"]


def test_chunked_budget_counts_drafts_and_prefix_caching_works():
    trace = make_trace("sharegpt", num_requests=60, rate=30.0, seed=4)
    spec = run(trace, policy="vllm-v1", speculative="eagle:4", max_num_batched_tokens=512,
               enable_prefix_caching=True)
    assert all(s.prefill_tokens + s.decode_tokens <= 512 for s in spec.steps)
    assert spec.kv_blocks_used_at_end >= 0 and spec.metrics.num_completed == 60
    assert spec.spec_decoding["num_drafts"] > 0


def test_published_curves_and_proposer_price():
    assert EAGLE_LLAMA31_8B_MTBENCH[0] == pytest.approx(0.781, abs=1e-3)
    # The published mean acceptance lengths come back from the curve (vLLM issue #20780).
    for k, al in zip(range(2, 8), (2.36, 2.79, 3.08, 3.32, 3.46, 3.54)):
        assert Speculation("eagle", k, EAGLE_LLAMA31_8B_MTBENCH[:k], "").expected_acceptance_length() == \
            pytest.approx(al, abs=0.01)
    assert speculation_of(Deployment(speculative="mtp:1")).acceptance == (0.875,)
    trace = fixed_trace(8, 100, 100)
    ngram = run(trace, concurrency=8, speculative="ngram:3", acceptance="0.7,0.7,0.7")
    eagle = run(trace, concurrency=8, speculative="eagle:3", acceptance="0.7,0.7,0.7")
    assert ngram.spec_decoding["proposer_seconds"] < eagle.spec_decoding["proposer_seconds"]


@pytest.mark.parametrize("deployment,message", [
    (dict(speculative="ngram:4"), "--acceptance"),
    (dict(speculative="draft:2"), "draft-model"),
    (dict(speculative="draft:2", draft_model="llama-3.2-1b"), "--acceptance"),
    (dict(speculative="draft:1", draft_model="qwen3-0.6b", acceptance="0.5"), "vocabulary of 151936"),
    (dict(speculative="eagle:9"), "7 positions"),
    (dict(speculative="mtp:2"), "1 position"),
    (dict(speculative="ngram:3", acceptance="0.5,0.5"), "3 rates"),
])
def test_what_cannot_be_modelled_is_refused(deployment, message):
    with pytest.raises(PlannerError, match=message):
        speculation_of(Deployment(**deployment))


SIM = ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--requests", "20", "--rate", "10"]


@pytest.mark.parametrize("args,message", [
    (["--speculative", "medusa:3"], "--speculative"), (["--speculative", "eagle"], "--speculative"),
    (["--speculative", "ngram:0"], "--speculative"), (["--speculative", "ngram:4"], "--acceptance"),
    (["--speculative", "draft:2"], "draft-model"),
    (["--speculative", "ngram:2", "--acceptance", "0.5,1.5"], "--acceptance"),
    (["--speculative", "ngram:2", "--acceptance", "high"], "--acceptance"),
    (["--acceptance", "0.5"], "--acceptance needs --speculative"),
    (["--speculative", "ngram:2", "--acceptance", "1,1", "--draft-rates", "0.5"], "2 rates"),
    (["--speculative", "ngram:2", "--acceptance", "1,1", "--draft-rates", "0.5,x"], "--draft-rates"),
    (["--speculative", "ngram:2", "--acceptance", "1,1", "--draft-persistence", "0.5"], "needs --draft-rates"),
    (["--speculative", "ngram:2", "--acceptance", "1,1", "--draft-rates", "1,1", "--draft-persistence", "2"],
     "--draft-persistence"),
])
def test_bad_flags_are_one_line_errors(args, message, tmp_path):
    result = CliRunner().invoke(app, SIM + args + ["--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len([line for line in result.output.splitlines() if line.strip()]) == 1


def test_simulate_takes_the_flag_and_reports_the_counters(tmp_path):
    result = CliRunner().invoke(app, SIM + ["--speculative", "eagle:3", "--json", "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    stats = doc["spec_decoding_stats"]
    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "acceptance_rate_per_pos",
                 "mean_acceptance_length"):
        assert name in stats
    assert doc["params"]["speculative"] == "eagle:3" and "--speculative eagle:3" in doc["command"]
    saved = json.loads((tmp_path / "r" / "result.json").read_text())
    assert saved["spec_decoding_stats"]["num_drafts"] == stats["num_drafts"]
    assert "mean acceptance length" in (tmp_path / "r" / "report.html").read_text().lower()


def test_simulate_sweeps_speculation_on_and_off(tmp_path):
    result = CliRunner().invoke(app, SIM + ["--speculative", "none,eagle:2", "--json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output


def test_search_takes_the_flag(tmp_path):
    result = CliRunner().invoke(app, ["search", "--model", "opt-125m", "--workload", "alpaca", "--requests", "30",
                                      "--slo", "ttft_p99=2,tpot_p99=0.1", "--gpus", "h100-sxm", "--tp", "1",
                                      "--max-num-seqs", "32", "--rate", "max", "--tolerance", "0.3",
                                      "--workers", "1", "--speculative", "eagle:2", "--out", str(tmp_path),
                                      "--json"])
    assert result.exit_code == 0, result.output
    verdict = json.loads(result.stdout)["speculation"]      # does it pay on the best configuration?
    assert verdict["speculative"] == "eagle:2" and verdict["capacity_without"] > 0
    loads = [p["load"] for p in verdict["points"]]
    assert loads == sorted(loads) and len(loads) == 5
    first = verdict["points"][0]            # a light load: the verify step's extra rows are nearly free
    assert first["tpot_mean_speculative"] < first["tpot_mean_plain"]
    stops = verdict["stops_paying_at"]
    assert stops is None or all(p["tpot_mean_speculative"] < p["tpot_mean_plain"] for p in verdict["points"]
                                if p["load"] < stops)


def test_search_shows_where_speculation_stops_paying():
    """At a load whose batches are large, speculation with a poor acceptance stops paying: the search says
    from which load, and the TPOTs it reports there agree."""
    from planner.runs.spec import Load, RunSpec
    from planner.sizing.speculation import speculation_pays
    spec = RunSpec(Deployment(model="llama-3.1-8b", gpu="h100-sxm", speculative="ngram:4", acceptance="0.3,0.2,0.1,0.1"),
                   Load(workload="sharegpt", requests=300, rate=1.0))
    verdict = speculation_pays(spec, {"tpot_p99": 1.0}, load=64.0, clients=False,
                               limits=dict(start=8.0, min_rate=0.01, max_rate=256.0, rel_tol=0.3))
    stops = verdict["stops_paying_at"]
    assert stops is not None and not verdict["pays_at_load"]
    at = next(p for p in verdict["points"] if p["load"] == stops)
    assert at["tpot_mean_speculative"] >= at["tpot_mean_plain"]


class _Seq:
    def __init__(self, seq_id: int, cached: int) -> None:
        self.seq_id, self.num_computed_tokens = seq_id, cached


def test_a_verify_step_reads_each_sequences_keys_once_in_vllm_and_per_row_in_the_engine():
    from planner.cost.calibrated import CalibratedCostModel
    from planner.cost.shape import StepShape, context_histogram, mixed_step_shape
    from planner.profile.schema import SHIPPED_PROFILES
    b, k, cached = 64, 3, 2000
    shape = mixed_step_shape([_Seq(i, cached) for i in range(b)], [k + 1] * b, 0, 0, True,
                             {i: [0] * k for i in range(b)})
    assert (shape.batch_size, shape.total_tokens, shape.logit_rows) == (b, b * (k + 1), b * (k + 1))
    assert shape.decode_context == b * (cached + k + 1)
    row_contexts = [cached + j for _ in range(b) for j in range(1, k + 2)]
    assert shape.decode_context + shape.draft_keys == sum(row_contexts)
    # vLLM (the measured model): attention as the plain decode of the same sequences at their last
    # row's context (keys read once); GEMMs, LM head and sampler over every row.
    plain = StepShape(decode_seqs=b, decode_context=shape.decode_context, decode_histogram=shape.decode_histogram)
    rows = StepShape(decode_seqs=len(row_contexts), decode_context=sum(row_contexts),
                     decode_histogram=context_histogram(row_contexts))
    assert MEASURED.decode_attention(shape) == MEASURED.decode_attention(plain)
    assert MEASURED.step_time(plain) < MEASURED.step_time(shape) < MEASURED.step_time(rows)
    assert MEASURED.ledger(shape).total == pytest.approx(MEASURED.step_time(shape))
    # This project's engine runs k + 1 decode rows, each over its own context; its host work is per sequence.
    calibrated = CalibratedCostModel.from_file(SHIPPED_PROFILES / "cpu" / "opt-125m.json")
    parts, as_rows = calibrated.breakdown(shape), calibrated.breakdown(rows)
    assert parts["forward"] == pytest.approx(as_rows["forward"]) and parts["sampling"] == as_rows["sampling"]
    assert parts["host"] == calibrated.breakdown(plain)["host"]
    assert calibrated.step_time(shape) == pytest.approx(sum(parts.values()))
