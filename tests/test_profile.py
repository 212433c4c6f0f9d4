"""`planner profile` on a tiny 2-layer model folder with a tiny grid: the real engine pieces, timed.

Timings on a shared CPU are noisy, so checks on numbers are loose; what must
hold exactly is the file round trip, the refusals, the per-layer arithmetic and
the monotonicity of the fitted model.
"""

from __future__ import annotations

import json
import statistics
from types import SimpleNamespace

import pytest

from engine.deployment import Deployment
import torch
from transformers import OPTConfig
from typer.testing import CliRunner

from planner.catalog import ModelSpec, resolve_model
from planner.cli.app import app
from planner.cost.calibrated import CalibratedCostModel
from planner.cost.shape import StepShape, prefill_attn_pairs
from planner.errors import PlannerError
from planner.profile.schema import COMPONENTS, load_profile, save_profile
from planner.profile.device import resolve_target
from planner.profile.grid import make_grid, prefill_context_points
from planner.profile.run import ProfileOptions, run_profile
# It times a live engine and checks the fit against the grid's timings (a busy neighbour worker once took the
# median error to 0.2517 against 0.25): scripts/test.sh runs it alone.
pytestmark = pytest.mark.serial

TINY_GRID = dict(prefill_tokens=[16, 64, 128], prefill_seqs=[1, 4], prefill_context=[64], decode_batch=[1, 4, 16],
                 decode_context=[16, 128], host_batch=[1, 8, 32], block_counts=[1, 4, 16], warmup=1)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-opt")
    OPTConfig(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=256,
              max_position_embeddings=256, word_embed_proj_dim=64).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_profile(tiny_model, tmp_path_factory):
    calls = []
    profile = run_profile(ProfileOptions(Deployment(model=str(tiny_model), gpu="cpu"), quick=True, repeats=3,
                                         grid_overrides=TINY_GRID), lambda desc, total: calls.append(total))
    path = save_profile(profile, tmp_path_factory.mktemp("profiles") / "cpu" / f"{profile.model.name}.json")
    return profile, path, calls


def test_profile_measures_every_component_and_records_its_setting(tiny_profile, tiny_model):
    profile, _, calls = tiny_profile
    assert {m.component for m in profile.measurements} == {*COMPONENTS, "mixed_decode"} == set(profile.fit)
    # The grid is timed in rounds (1 warm-up + 3 repeats), each point once per round, and points
    # whose repetitions scattered (a busy machine) once more per extra round.
    rounds = 1 + 3
    assert len(calls) >= rounds * len(profile.measurements) and set(calls) == {rounds * len(profile.measurements)}
    assert profile.device.gpu == "cpu" and profile.device.kind == "cpu" and profile.dtype == "float32"
    assert profile.device.torch_version == torch.__version__
    assert profile.model.num_layers == 2 and profile.model.name == tiny_model.name
    assert not profile.per_layer_scaling
    # Every (tokens, seqs) combination where the tokens split evenly into prompts: 6 fresh prefill points;
    # and one prompt of each length after 64 cached tokens
    prefills = [m.features for m in profile.measurements if m.component == "prefill"]
    assert sorted((f["tokens"], f["seqs"]) for f in prefills if not f["context"]) == [
        (16, 1), (16, 4), (64, 1), (64, 4), (128, 1), (128, 4)]
    assert sorted((f["tokens"], f["context"], f["attn_pairs"]) for f in prefills if f["context"]) == [
        (16, 64, 16 * 64 + 136), (64, 64, 64 * 64 + 2080), (128, 64, 128 * 64 + 8256)]
    for m in profile.measurements:
        assert len(m.samples_s) >= 3 and m.median_s == statistics.median(m.samples_s) > 0


def test_round_trip_and_calibrated_model_reproduces_the_grid(tiny_profile, tiny_model):
    profile, path, _ = tiny_profile
    assert load_profile(path) == profile
    model = CalibratedCostModel.from_file(path, model=ModelSpec.from_model_dir(tiny_model), gpu="cpu")
    errors = []
    for m in profile.measurements:
        f = m.features
        if m.component == "prefill":
            shape = StepShape(prefill_seqs=int(f["seqs"]), prefill_tokens=int(f["tokens"]),
                              prefill_attn_pairs=int(f["attn_pairs"]), prefill_context=int(f["context"]))
            predicted = model.breakdown(shape)["forward"]
        elif m.component == "decode":
            predicted = model.breakdown(StepShape(decode_seqs=int(f["seqs"]),
                                                  decode_context=int(f["context"])))["forward"]
        else:
            continue
        errors.append(abs(predicted - m.median_s) / m.median_s)
    # In-sample error of a fit to the medians: loose, because a shared CPU is noisy.
    assert statistics.median(errors) < 0.25, errors


def test_calibrated_model_is_monotone_in_tokens_and_context(tiny_profile):
    _, path, _ = tiny_profile
    model = CalibratedCostModel.from_file(path)
    prefill = [model.step_time(StepShape(prefill_seqs=1, prefill_tokens=t, prefill_attn_pairs=prefill_attn_pairs(t)))
               for t in range(1, 600, 13)]
    assert all(b >= a for a, b in zip(prefill, prefill[1:]))
    for batch in (1, 8, 40):
        decode = [model.step_time(StepShape(decode_seqs=batch, decode_context=batch * c)) for c in range(1, 400, 9)]
        assert all(b >= a for a, b in zip(decode, decode[1:]))


def test_damaged_or_mismatched_profile_is_refused(tiny_profile, tmp_path):
    profile, path, _ = tiny_profile
    text = path.read_text()
    truncated = tmp_path / "truncated.json"
    truncated.write_text(text[: len(text) // 2])
    with pytest.raises(PlannerError, match="not valid JSON"):
        CalibratedCostModel.from_file(truncated)
    old = tmp_path / "old.json"
    data = json.loads(text)
    data["schema_version"] = 0
    old.write_text(json.dumps(data))
    with pytest.raises(PlannerError, match="schema version 0"):
        CalibratedCostModel.from_file(old)
    with pytest.raises(PlannerError, match="not 'opt-125m'"):
        CalibratedCostModel.from_file(path, model=resolve_model("opt-125m"))


def test_per_layer_scaling_combines_one_and_two_layer_models(tiny_model):
    grid = dict(TINY_GRID, prefill_tokens=[32], prefill_seqs=[1], decode_batch=[2], decode_context=[32],
                host_batch=[1, 2], block_counts=[1, 2])
    profile = run_profile(ProfileOptions(Deployment(model=str(tiny_model), gpu="cpu"), quick=True, repeats=2, per_layer=True,
                                         grid_overrides=grid))
    assert profile.per_layer_scaling
    scaled = [m for m in profile.measurements if m.layer_medians_s]
    assert {m.component for m in scaled} == {"prefill", "decode", "mixed_decode", "swap", "copy"}
    for m in scaled:
        t1, t2 = m.layer_medians_s["1"], m.layer_medians_s["2"]
        # the tiny model has 2 layers: t1 + 1 * (t2 - t1), or t1 if noise made t2 smaller
        assert m.median_s == pytest.approx(max(t2, t1))
    assert any("1- and 2-layer" in note for note in profile.grid.notes)


def test_prompts_after_a_cached_context_are_part_of_every_grid():
    # GPU: every length from 16 tokens after 128 to 2048 cached, within the model's positions
    gpu = make_grid(quick=False, on_cpu=False, max_model_len=4096, kv_cache_blocks=10_000)
    points = prefill_context_points(gpu, 4096)
    assert (16, 128) in points and (2048, 2048) in points
    assert min(t for t, _ in points) == 16
    assert prefill_context_points(gpu, 2048) == [(t, c) for t, c in points if t + c <= 2048]
    # CPU: the cached context is capped with the prompt, at 1024
    cpu = make_grid(quick=False, on_cpu=True, max_model_len=4096, kv_cache_blocks=10_000)
    assert cpu.prefill_context == [128, 512, 1024]
    quick = make_grid(quick=True, on_cpu=True, max_model_len=4096, kv_cache_blocks=10_000)
    assert quick.prefill_context == [128, 1024]


# -- device checks and the command line --------------------------------------------

def test_profile_command_refuses_a_missing_gpu_and_bad_options(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    runner = CliRunner()
    result = runner.invoke(app, ["profile", "--gpu", "a100"])
    assert result.exit_code == 2
    assert "error: no CUDA device found: cannot profile a100-40g (use --gpu cpu, or --force)" in result.output
    for args, message in ((["--gpu", "tpu9"], "unknown GPU 'tpu9'"),
                          (["--gpu", "cpu", "--tp", "2"], "--tp 2"),
                          (["--gpu", "cpu", "--block-size", "7"], "block_size 7"),
                          (["--gpu", "cpu", "--model", "no-such-model"], "unknown model")):
        result = runner.invoke(app, ["profile", *args])
        assert result.exit_code == 2 and message in result.output, result.output


def _fake_cuda(monkeypatch, name: str, memory_gib: float):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: name)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index=0: SimpleNamespace(name=name, total_memory=int(memory_gib * 2**30)))


def test_detected_gpu_variant_and_kind_mismatch(monkeypatch):
    _fake_cuda(monkeypatch, "NVIDIA A100-SXM4-80GB", 79.2)
    target = resolve_target("a100")                       # the family matches; the memory picks the 80 GB variant
    assert target.gpu.name == "a100-80g" and target.dtype == torch.float16 and not target.forced
    _fake_cuda(monkeypatch, "NVIDIA H100 80GB HBM3", 79.6)
    with pytest.raises(PlannerError, match=r"is 'NVIDIA H100 80GB HBM3' \(h100-sxm\), not a100-40g: use --gpu h100-sxm"):
        resolve_target("a100")
    forced = resolve_target("a100", force=True)
    assert forced.forced and forced.gpu.name == "a100-40g"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_target("a100", force=True).device.type == "cpu"


def test_points_caught_in_a_slow_spell_are_timed_again():
    # A shared CPU stalls a step several-fold while another process runs: a point whose repetitions
    # scatter gets extra rounds, so its median rests on steady repetitions; steady points get none.
    from planner.profile.run import _measure, _Point

    spikes = iter([0.5, 0.6, 0.7])               # the first three timed repetitions of "noisy" are stalled
    noisy = _Point("sched_decode", {"seqs": 1}, lambda _: [next(spikes, 0.1)], False)
    steady = _Point("sched_decode", {"seqs": 2}, lambda _: [0.2], False)
    samples = [[[]], [[]]]
    _measure([noisy, steady], range(2), None, 0, rounds=5, warmup=0, samples=samples, progress=None, total=10)
    assert len(samples[1][0]) == 5                          # steady: its five rounds only
    assert len(samples[0][0]) > 5 and sorted(samples[0][0])[len(samples[0][0]) // 2] == 0.1
