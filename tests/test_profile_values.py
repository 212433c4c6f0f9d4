"""A profile file is checked on load for finite, positive, monotone fits and for the model and device it describes."""
from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from planner.catalog import resolve_model
from planner.cli.app import app
from planner.cost.calibrated import CalibratedCostModel
from planner.errors import PlannerError
from planner.profile.schema import SHIPPED_PROFILES, ModelArch, load_profile

SHIPPED = SHIPPED_PROFILES / "cpu" / "opt-125m.json"


def _edited(tmp_path, edit, name="edited.json"):
    """The shipped profile, edited by `edit(doc)` and saved under tmp_path."""
    doc = json.loads(SHIPPED.read_text())
    edit(doc)
    path = tmp_path / name
    path.write_text(json.dumps(doc))       # NaN and Infinity written as JSON's extension, which json.loads reads
    return path


def _chosen(doc, component):
    fit = doc["fit"][component]
    return fit["candidates"][fit["chosen"]]


def _set(component, key, index, value):
    def edit(doc):
        _chosen(doc, component)[key][index] = value
    return edit


def _refused(path, *words):
    with pytest.raises(PlannerError) as err:
        load_profile(path)
    message = str(err.value)
    assert str(path) in message and "\n" not in message, message
    for word in words:
        assert word in message, message
    return message


def test_the_shipped_profile_passes_every_check():
    profile = load_profile(SHIPPED)
    assert profile.model.name == "opt-125m"


@pytest.mark.parametrize("edit, words", [
    (_set("decode", "values", 3, math.nan), ("fit.decode", "nan", "finite")),
    (_set("prefill", "values", 0, math.inf), ("fit.prefill", "inf")),
    (_set("sched_decode", "values", 1, -1e-5), ("fit.sched_decode", "negative")),
    (lambda d: _chosen(d, "decode")["extras"].update(context=-1e-6), ("fit.decode", "negative context term")),
    (lambda d: d["fit"]["copy"]["candidates"]["piecewise"]["values"].__setitem__(0, math.nan),
     ("fit.copy (piecewise)", "nan")),     # an unused candidate is checked too
    (lambda d: d["fit"]["decode"].update(residual_sd=math.nan), ("fit.decode.residual_sd",)),
    (lambda d: d["measurements"][0].update(median_s=-0.5), ("measurement 0", "-0.5")),
    # finite, yet past what prices them (1e308 s overflowed the step's sum), or names no planner reads
    (_set("decode", "values", 3, 1e308), ("fit.decode", "1e+308", "over 1e+09")),
    (lambda d: _chosen(d, "decode")["extras"].update(context=1e308), ("fit.decode", "1e+308")),
    (lambda d: _chosen(d, "decode").update(extras={"bogus": 1.0}), ("fit.decode", "over seqs, bogus",
                                                                    "variables are seqs, context")),
    (lambda d: _chosen(d, "decode").update(main="tokens"), ("fit.decode", "over tokens")),
    (lambda d: d["fit"].update(bogus=d["fit"]["copy"]), ("fit.bogus is no component",)),
    (lambda d: d.update(schema_version=True), ("schema version True",)),
    (lambda d: d.update(lora_rank=-5), ("lora_rank",)),
])
def test_non_finite_or_negative_fits_are_refused_naming_the_component(tmp_path, edit, words):
    _refused(_edited(tmp_path, edit), *words)


@pytest.mark.parametrize("text, words", [("[" * 100_000 + "]" * 100_000, "nested too deeply"),
                                         ('{"schema_version": 1' + "1" * 5000 + "}", "more than 4,300 digits")])
def test_json_no_parser_can_take_is_refused_in_one_line(tmp_path, text, words):
    path = tmp_path / "profile.json"
    path.write_text(text)
    _refused(path, "not valid JSON", words)


def _reversed(component):
    def edit(doc):
        curve = _chosen(doc, component)
        curve["values"] = curve["values"][::-1]
    return edit


def _piecewise_with_last(component, value):
    """The component's piecewise candidate chosen (whichever the shipped fit chose), its last value set."""
    def edit(doc):
        doc["fit"][component]["chosen"] = "piecewise"
        _chosen(doc, component)["values"][-1] = value
    return edit


@pytest.mark.parametrize("edit, words", [
    (_reversed("prefill"), ("fit.prefill decreases", "tokens")),            # time falls with tokens
    (_reversed("decode"), ("fit.decode decreases", "seqs")),                # ... with batch
    (_piecewise_with_last("swap", 1e-9), ("fit.swap decreases past its last grid values", "blocks")),
    (lambda d: _chosen(d, "copy").update(values=[0.0, 0.0]), ("fit.copy predicts no time",)),
])
def test_curves_that_fall_where_time_must_grow_are_refused(tmp_path, edit, words):
    _refused(_edited(tmp_path, edit), *words)


def test_a_measured_dip_inside_the_grid_is_kept(tmp_path):
    # The shipped prefill curve dips 18% between 3 and 4 tokens, as this CPU's matmuls do: the fit keeps
    # interior dips, and so does the check (a slow point on a busy machine makes the next look like a dip).
    values = load_profile(SHIPPED).fit["prefill"].curve.values
    assert values[3] < 0.85 * values[2]
    path = _edited(tmp_path, _set("decode", "values", 6, 0.5 * _chosen(json.loads(SHIPPED.read_text()),
                                                                          "decode")["values"][5]))
    assert load_profile(path).fit["decode"].curve.values[6] < load_profile(SHIPPED).fit["decode"].curve.values[5]


def _relabelled(model: str, *, architecture: bool):
    def edit(doc):
        doc["model"]["name"] = model
        if architecture:
            doc["model"].update(ModelArch.of(resolve_model(model)).model_dump())
    return edit


def test_a_profile_labelled_for_another_model_is_refused_on_load(tmp_path):
    path = _edited(tmp_path, _relabelled("opt-13b", architecture=False), "opt13b.json")
    _refused(path, "describes model 'opt-13b'", "num_layers 12 where opt-13b has 40")


def test_a_profile_of_another_model_is_refused_for_this_one(tmp_path):
    path = _edited(tmp_path, _relabelled("opt-13b", architecture=True), "opt13b.json")
    load_profile(path)                                   # a consistent profile of opt-13b: fine on its own
    with pytest.raises(PlannerError, match="describes model 'opt-13b', not 'opt-125m'"):
        CalibratedCostModel.from_file(path, model=resolve_model("opt-125m"))


@pytest.mark.parametrize("label", [False, True])
def test_simulate_and_validate_refuse_an_opt13b_profile_for_opt125m(tmp_path, label):
    path = _edited(tmp_path, _relabelled("opt-13b", architecture=label), "opt13b.json")
    for command in (["simulate", "--workload", "alpaca", "--requests", "4"],
                    ["validate", "--quick", "--out", str(tmp_path / "run")]):
        result = CliRunner().invoke(app, [*command, "--model", "opt-125m", "--gpu", "cpu",
                                          "--profile", str(path)])
        assert result.exit_code == 2, result.output
        error = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
        assert len(error) == 1 and result.stderr.endswith(error[0] + "\n"), result.stderr   # one line, the last
        assert "opt-13b" in error[0] and "machine has changed" not in result.stderr
        assert not (tmp_path / "run").exists()                        # refused before any live run


@pytest.mark.parametrize("edit, words", [
    (lambda d: d["device"].update(gpu="tpu-v9"), ("describes GPU 'tpu-v9'", "not in the catalog")),
    (lambda d: d["device"].update(gpu="a100-40g"), ("describes a100-40g (a gpu)", "measured on a cpu")),
    (lambda d: d["fingerprint"].update(block_size=32), ("fingerprint contradicts", "block size 32 (profile: 16)")),
    (lambda d: d["fingerprint"].update(device_kind="gpu"), ("fingerprint contradicts", "device kind 'gpu'")),
])
def test_a_profile_whose_device_labels_disagree_is_refused(tmp_path, edit, words):
    _refused(_edited(tmp_path, edit), *words)


def test_a_forced_profile_may_name_a_gpu_it_was_not_measured_on(tmp_path):
    path = _edited(tmp_path, lambda d: d["device"].update(gpu="a100-40g", forced=True))
    assert load_profile(path).device.forced
