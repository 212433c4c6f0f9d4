"""A checkpoint the engine cannot run is bad input: a ValueError naming what is
unsupported, which the CLI turns into one line and a non-zero exit."""
import json

import pytest
from typer.testing import CliRunner

from engine import LLM
from planner.cli.app import app
from tiny_models import save_tiny_model


@pytest.fixture(scope="module")
def yarn_llama(tmp_path_factory):
    folder = save_tiny_model("llama", tmp_path_factory.mktemp("yarn"))
    path = f"{folder}/config.json"
    config = json.load(open(path))
    config["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    json.dump(config, open(path, "w"))
    return folder


def test_llm_rejects_an_unsupported_rope_type_with_a_value_error(yarn_llama):
    with pytest.raises(ValueError, match="rope_type 'yarn' is not supported"):
        LLM(yarn_llama, num_gpu_blocks=8)


def test_serve_reports_an_unsupported_checkpoint_in_one_line(yarn_llama):
    result = CliRunner().invoke(app, ["serve", "--model", yarn_llama, "--port", "1"])
    assert result.exit_code != 0
    assert "rope_type 'yarn' is not supported" in result.output
    assert "Traceback" not in result.output


def test_a_config_transformers_refuses_is_named_in_one_line(tmp_path):
    # transformers 5's configs are strict dataclasses: a field of the wrong type raises their own error
    # type, not a ValueError; the engine and the profiler name the file and what is wrong instead
    folder = save_tiny_model("llama", tmp_path / "m")
    config = json.load(open(f"{folder}/config.json"))
    config["num_hidden_layers"] = "two"
    json.dump(config, open(f"{folder}/config.json", "w"))
    with pytest.raises(ValueError, match=r"config\.json: .*num_hidden_layers") as info:
        LLM(folder, num_gpu_blocks=8)
    assert "\n" not in str(info.value)
    result = CliRunner().invoke(app, ["profile", "--gpu", "cpu", "--model", folder, "--quick",
                                      "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 2 and "'two'" in result.output and "Traceback" not in result.output
    # one the planner's own reading lets through reaches transformers: Phi-3's LongRoPE factors must number
    # head_dim / 2, which transformers checks as a class validation error
    phi3 = save_tiny_model("phi3", tmp_path / "phi3")
    config = json.load(open(f"{phi3}/config.json"))
    config["rope_scaling"] = {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0],
                              "original_max_position_embeddings": 64}
    config.pop("rope_parameters", None)
    json.dump(config, open(f"{phi3}/config.json", "w"))
    result = CliRunner().invoke(app, ["profile", "--gpu", "cpu", "--model", phi3, "--quick",
                                      "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 2 and "config.json: " in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
