"""The restructure changed no number: every golden command prints what it printed before (issue 22)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from golden_cases import CASES, LIVE_VALIDATION, numbers, same_number
from planner.cli.app import app

GOLDEN = Path(__file__).parent / "data" / "golden"


def _differences(expected: dict, got: dict) -> list[str]:
    want, have = numbers(expected), numbers(got)
    out = [f"{path}: missing (was {value})" for path, value in want.items() if path not in have]
    out += [f"{path}: {have[path]} (was {value})" for path, value in want.items()
            if path in have and not same_number(value, have[path])]
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_command_prints_the_numbers_it_printed_before(name, tmp_path, monkeypatch):
    monkeypatch.chdir(Path(__file__).parent.parent)       # the cases name repository paths
    result = CliRunner().invoke(app, [*CASES[name], "--json", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    differences = _differences(json.loads((GOLDEN / f"{name}.json").read_text()), got)
    assert not differences, "\n".join(differences[:20])


@pytest.mark.serial     # a live engine on the wall clock: run alone (scripts/test.sh)
def test_live_validation_simulates_what_it_simulated_before(monkeypatch):
    from engine.deployment import Deployment
    from planner.catalog import resolve_gpu, resolve_model
    from planner.cost.calibrated import CalibratedCostModel
    from planner.validation.run import validate
    from planner.validation.spec import ValidationSpec

    monkeypatch.chdir(Path(__file__).parent.parent)
    settings = dict(LIVE_VALIDATION)
    deployment = Deployment(model=settings.pop("model"), gpu=settings.pop("gpu"),
                            block_size=settings.pop("block_size"), max_num_seqs=settings.pop("max_num_seqs"),
                            policy=settings.pop("policy"))
    cost = CalibratedCostModel.from_file(settings["profile"], model=resolve_model("opt-125m"), gpu=resolve_gpu("cpu"))
    v = validate(ValidationSpec(deployment=deployment, **settings, speed_correction=False), cost_model=cost)
    got = {"simulated": {k: row["simulated"] for k, row in v.comparison().items()},
           "num_gpu_blocks": v.live.num_gpu_blocks, "max_model_len": v.live.max_model_len,
           "max_num_batched_tokens": v.live.max_num_batched_tokens}
    differences = _differences(json.loads((GOLDEN / "validate-live.json").read_text()), got)
    assert not differences, "\n".join(differences)
