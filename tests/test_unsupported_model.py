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
