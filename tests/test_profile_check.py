"""Trusting a profile: its fingerprint, matching on the engine settings, the canary, validate's pinning."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.deployment import Deployment
import torch
from typer.testing import CliRunner

from planner.profile import check as profile_check
from planner.profile.components import DIFFERENCE_COMPONENTS
from planner.catalog import ModelSpec, resolve_gpu
from planner.cli.app import app
from planner.cost.select import select_cost_model
from planner.errors import PlannerError
from planner.profile.check import (check_cost_model, check_profile, config_differences, cpu_topology, engine_version,
                                   find_profile, pin_live_device, require_device, run_canary)
from planner.profile.schema import load_profile, save_profile
from planner.profile.run import ProfileOptions, run_profile
from tiny_models import save_tiny_model

# It reads the wall clock (a live engine, a server, a time limit): scripts/test.sh runs it alone.
pytestmark = pytest.mark.serial

SMALL_GRID = dict(prefill_tokens=[16, 64], prefill_seqs=[1], decode_batch=[1, 4], decode_context=[16, 64],
                  host_batch=[1, 8], block_counts=[1, 4], warmup=0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = save_tiny_model("opt", tmp_path_factory.mktemp("tiny-opt"))
    profile = run_profile(ProfileOptions(Deployment(model=str(folder), gpu="cpu"), quick=True, repeats=2,
                                         grid_overrides=SMALL_GRID))
    return folder, profile


def _saved(profile, folder, name="p.json", **changes):
    doc = json.loads(profile.model_dump_json())
    for dotted, value in changes.items():
        node = doc
        *path, last = dotted.split(".")
        for key in path:
            node = node[key]
        node[last] = value
    path = folder / name
    path.write_text(json.dumps(doc))
    return path


def test_profile_records_the_fingerprint_of_this_machine(tiny):
    _, profile = tiny
    fp = profile.fingerprint
    cpu_model, cores, threads = cpu_topology()
    assert (fp.device_kind, fp.cpu_model, fp.cpu_cores, fp.cpu_threads) == ("cpu", cpu_model, cores, threads)
    assert fp.torch_threads == torch.get_num_threads() and fp.torch_version == torch.__version__
    assert (fp.dtype, fp.block_size, fp.tp) == ("float32", 16, 1)
    assert fp.engine_version == engine_version() and "+" in fp.engine_version
    # (a difference of two passes has none: its scatter is the passes')
    assert all(f.residual_sd is not None and f.residual_sd >= 0 for name, f in profile.fit.items()
               if name not in DIFFERENCE_COMPONENTS)
    assert profile.fit["mixed_decode"].residual_sd is None


def test_a_profile_without_fingerprint_loads_and_is_unchecked(tiny, tmp_path):
    _, profile = tiny
    doc = json.loads(profile.model_dump_json())
    del doc["fingerprint"]
    for fit in doc["fit"].values():
        del fit["residual_sd"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    check = check_profile(load_profile(path), path)
    assert check.status == "unchecked" and "no fingerprint" in check.reason and check.ratio is None


def test_another_cpu_makes_the_profile_stale_without_timing_anything(tiny, tmp_path, monkeypatch):
    _, profile = tiny
    path = _saved(profile, tmp_path, **{"fingerprint.cpu_model": "Some Other CPU", "fingerprint.cpu_threads": 999})
    monkeypatch.setattr(profile_check, "run_canary", lambda *a, **k: pytest.fail("canary ran"))
    check = check_profile(load_profile(path), path, model_folder="unused")
    assert check.status == "stale" and "another machine" in check.reason and "Some Other CPU" in check.reason


def test_a_gpu_profile_without_the_gpu_is_checked_by_fingerprint_only(tiny, tmp_path, monkeypatch):
    _, profile = tiny
    path = _saved(profile, tmp_path, **{"fingerprint.device_kind": "gpu", "fingerprint.device_name": "NVIDIA H200",
                                        "device.gpu": "h200", "device.kind": "gpu", "device.device_name": "NVIDIA H200"})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    check = check_profile(load_profile(path), path, model_folder="unused")
    assert check.status == "unchecked" and check.fingerprint_only and "checked by fingerprint only" in check.reason


@pytest.mark.parametrize("ratio,status", [(1.0, "ok"), (1.06, "ok"), (0.92, "stale"), (1.5, "stale")])
def test_canary_ratio_decides(tiny, monkeypatch, ratio, status):
    folder, profile = tiny
    monkeypatch.setattr(profile_check, "run_canary", lambda *a, **k: ([{"measured_s": ratio}], ratio))
    check = check_profile(profile, "p.json", model_folder=str(folder))
    assert check.status == status and check.ratio == ratio


def test_canary_times_profile_points_again_within_budget(tiny, tmp_path):
    folder, profile = tiny
    # A profile claiming everything took 10x longer than it does: the canary sees a ratio well below 1
    # (loose: a shared CPU's load can slow the re-timing several-fold).
    slow = load_profile(_saved(profile, tmp_path))
    for m in slow.measurements:
        m.median_s *= 10
    points, ratio = run_canary(slow, str(folder), budget_s=10)
    assert points and {p["component"] for p in points} <= {"prefill", "decode"}
    assert ratio is not None and ratio < 0.5
    # The classification on top of it: stale.
    check = check_profile(slow, "slow.json", model_folder=str(folder))
    assert check.status == "stale" and check.canary and "off the profile" in check.reason


def test_profiles_match_on_block_size_dtype_and_tp(tiny, tmp_path):
    folder, profile = tiny
    spec = ModelSpec.from_model_dir(Path(folder))
    save_profile(profile, tmp_path / "cpu" / "tiny.json")
    path, miss = find_profile(tmp_path / "cpu", spec, block_size=16, dtype="float32", tp=1)
    assert path == tmp_path / "cpu" / "tiny.json" and miss is None
    path, miss = find_profile(tmp_path / "cpu", spec, block_size=32, dtype="float32", tp=1)
    assert path is None and "block size 16 (run: 32)" in miss and "dtype" not in miss
    assert config_differences(profile, block_size=16, dtype="float16", tp=2) == ["dtype float32 (run: float16)",
                                                                                 "TP 1 (run: 2)"]
    # A second profile with the other block size is found beside the first.
    bs32 = profile.model_copy(update={"block_size": 32,
                                      "fingerprint": profile.fingerprint.model_copy(update={"block_size": 32})})
    save_profile(bs32, tmp_path / "cpu" / "tiny-bs32.json")
    assert find_profile(tmp_path / "cpu", spec, block_size=32, dtype="float32", tp=1)[0].name == "tiny-bs32.json"


def test_select_falls_back_with_a_message_or_refuses_an_explicit_near_miss(tiny, tmp_path, monkeypatch):
    folder, profile = tiny
    spec = ModelSpec.from_model_dir(Path(folder))
    save_profile(profile, tmp_path / "cpu" / f"{spec.name}.json")
    monkeypatch.setenv("PLANNER_PROFILE_DIR", str(tmp_path))
    cpu = resolve_gpu("cpu")
    assert select_cost_model(spec, cpu, block_size=16).name.startswith("calibrated")
    roofline = select_cost_model(spec, cpu, block_size=32)
    assert not roofline.name.startswith("calibrated") and "block size 16 (run: 32)" in roofline.profile_note
    assert check_cost_model(roofline, str(folder)).reason == roofline.profile_note
    with pytest.raises(PlannerError, match="does not match this run: block size 16 \\(run: 8\\)"):
        select_cost_model(spec, cpu, block_size=8, profile=tmp_path / "cpu" / f"{spec.name}.json")


def test_simulate_reports_a_stale_profile_in_header_and_result(tiny, tmp_path):
    folder, profile = tiny
    path = _saved(profile, tmp_path, **{"fingerprint.cpu_model": "Another CPU"})
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["simulate", "--gpu", "cpu", "--model", str(folder), "--workload", "alpaca",
                                      "-n", "5", "--profile", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "profile check: stale" in result.output
    check = json.loads((out / "result.json").read_text())["profile_check"]
    assert check["status"] == "stale" and check["ratio"] is None and "Another CPU" in check["reason"]


def _fake_cuda(monkeypatch, name, gib):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: name)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *_: SimpleNamespace(total_memory=int(gib * 2**30)))


def test_validate_runs_only_on_the_named_catalog_gpu(monkeypatch, tiny):
    _, profile = tiny
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(PlannerError, match="no CUDA device found"):
        require_device(resolve_gpu("h200"))
    _fake_cuda(monkeypatch, "NVIDIA A100-SXM4-80GB", 79.2)
    with pytest.raises(PlannerError, match="is 'NVIDIA A100-SXM4-80GB' \\(a100-80g\\), not h200.*--gpu a100-80g"):
        require_device(resolve_gpu("h200"))
    require_device(resolve_gpu("a100-80g"))
    assert pin_live_device(resolve_gpu("cpu"), profile) == ("cpu", "float32")
    gpu_profile = profile.model_copy(update={"device": profile.device.model_copy(
        update={"kind": "gpu", "gpu": "a100-80g"}), "dtype": "float16"})
    assert pin_live_device(resolve_gpu("a100-80g"), gpu_profile) == ("cuda", "float16")
    forced = gpu_profile.model_copy(update={"device": gpu_profile.device.model_copy(update={"forced": True})})
    with pytest.raises(PlannerError, match="forced"):
        pin_live_device(resolve_gpu("a100-80g"), forced)


def test_validate_no_reprofile_refuses_a_stale_profile(tiny, tmp_path):
    from planner.validation.run import trusted_profile
    from planner.validation.spec import ValidationSpec
    folder, profile = tiny
    path = _saved(profile, tmp_path, **{"fingerprint.cpu_cores": 12345})
    spec = ValidationSpec(Deployment(model=str(folder), gpu="cpu"), profile=str(path))
    with pytest.raises(PlannerError, match="is stale .*drop --no-reprofile"):
        trusted_profile(spec, refuse_stale=True, say=lambda *_: None)
    assert trusted_profile(spec, refuse_stale=False, say=lambda *_: None)[1].status == "stale"


def test_timing_noise_samples_the_profile_residuals_reproducibly(tiny, tmp_path, monkeypatch):
    folder, profile = tiny
    monkeypatch.setattr(profile_check, "run_canary", lambda *a, **k: ([], 1.0))   # not what is tested here
    path = save_profile(profile, tmp_path / "p.json")

    def e2e(*flags):
        out = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        result = CliRunner().invoke(app, ["simulate", "--gpu", "cpu", "--model", str(folder), "--workload", "alpaca",
                                          "-n", "8", "--rate", "50", "--profile", str(path), "--out", str(out),
                                          *flags])
        assert result.exit_code == 0, result.output
        return json.loads((out / "result.json").read_text())
    plain, noisy, again = e2e(), e2e("--timing-noise"), e2e("--timing-noise")
    assert noisy["e2e_mean"] == again["e2e_mean"] != plain["e2e_mean"]
    assert noisy["cost_model"].endswith("+noise")


def test_validate_cli_no_reprofile_refuses_a_stale_profile_in_one_line(tiny, tmp_path):
    folder, profile = tiny
    path = _saved(profile, tmp_path, **{"fingerprint.cpu_model": "Elsewhere CPU"})
    result = CliRunner().invoke(app, ["validate", "--model", str(folder), "--profile", str(path), "--no-reprofile",
                                      "--out", str(tmp_path / "v")])
    assert result.exit_code != 0
    assert "is stale (profiled on another machine: CPU 'Elsewhere CPU'" in result.output
    assert "Traceback" not in result.output


def test_validate_cli_reprofiles_a_stale_profile_by_itself(tiny, tmp_path, monkeypatch):
    from planner.profile import along
    folder, profile = tiny
    stale = _saved(profile, tmp_path, "stale.json", **{"fingerprint.cpu_model": "Elsewhere CPU"})
    fresh = save_profile(profile, tmp_path / "fresh.json")
    calls = []

    class Along:          # stands in for the quick profile timed along the live run
        timeline = None

        def __init__(self, gpu, model, block_size, path, span_s, say, lora=None):
            calls.append((block_size, span_s))

        def before_run(self):
            calls.append("before")

        def live_device(self):
            return "cpu", "float32"

        def before_steps(self, runner):
            assert runner.model_path == str(folder)     # the live engine's own
            calls.append("beside")

        def between_steps(self, busy_s, now):
            assert busy_s > 0
            if calls[-1] != "between":
                calls.append("between")

        def after_run(self):
            calls.append("after")
            return fresh

        def describe(self):
            return "profiled just now"

    monkeypatch.setattr(along, "profile_for_live_run", Along)
    out = tmp_path / "v"
    result = CliRunner().invoke(app, ["validate", "--model", str(folder), "--profile", str(stale), "--workload",
                                      "alpaca", "--requests", "4", "--rate", "50", "--length-scale", "0.1",
                                      "--max-output-len", "4", "--attribution", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    # re-profiled once, at the run's block size, before, beside the live engine, between the steps of and
    # after the live run
    (block_size, span_s), *order = calls
    assert block_size == 16 and 0 < span_s < 1 and order == ["before", "beside", "between", "after"]
    doc = json.loads((out / "comparison.json").read_text())
    assert doc["profile_check"]["status"] == "ok" and doc["error_attribution"]["e2e_mean"] is not None
    assert str(fresh) in doc["cost_model"]
