"""vLLM's --stream-interval: a streamed answer's tokens sent N at a time after the first, in the simulator's
records, the live engine's and `planner serve`'s stream (vllm/v1/engine/output_processor.py,
RequestState.make_request_output)."""
from __future__ import annotations

import openai
import pytest
from typer.testing import CliRunner

from engine.core.metrics import streamed_times
from engine.deployment import Deployment
from engine.entrypoints.openai.server import BackgroundServer
from engine.llm_engine import LLMEngine
from planner.api import simulate
from planner.cli.app import app
from serve_helpers import save_byte_model


@pytest.mark.parametrize("count,interval,sent", [
    (10, 4, [0, 4, 8, 9]),     # the first at once, then every 4th, the rest at the end
    (9, 4, [0, 4, 8]),         # the last one completes a chunk
    (2, 3, [0, 1]),
    (1, 3, [0]),
    (5, 1, [0, 1, 2, 3, 4]),   # vLLM's default: every token
])
def test_the_times_a_client_gets_tokens_at(count, interval, sent):
    times = [0.5 * i for i in range(count)]
    assert streamed_times(times, interval) == [times[i] for i in sent]


def test_a_simulated_stream_interval_changes_itl_alone():
    deployments = [Deployment(model="llama-3.1-8b", gpu="h100-sxm", stream_interval=n) for n in (1, 8)]
    every, chunked = [simulate(d, workload="sharegpt", rate=4, requests=60, seed=2).sim for d in deployments]
    assert [streamed_times(r.token_times, 8) for r in every.requests] == [r.token_times for r in chunked.requests]
    assert every.steps == chunked.steps
    one, eight = every.summary(), chunked.summary()
    for metric in ("ttft_mean", "tpot_mean", "e2e_mean", "request_throughput"):
        assert eight[metric] == one[metric]
    assert 7.0 * one["itl_mean"] < eight["itl_mean"] < 8.0 * one["itl_mean"]    # (a last chunk is shorter)


@pytest.mark.parametrize("knobs,words", [
    ({"stream_interval": 0}, "stream_interval must be >= 1"),
    ({"stream_interval": 4, "speculative": "eagle:3"}, "with speculative decoding is not modelled"),
])
def test_refused(knobs, words):
    with pytest.raises(ValueError, match=words):
        Deployment(**knobs)


def test_from_vllm_reads_it():
    result = CliRunner().invoke(app, ["from-vllm", "--gpu", "h100-sxm", "--serve",
                                      "vllm serve meta-llama/Llama-3.1-8B-Instruct --stream-interval 8"])
    assert result.exit_code == 0, result.output
    assert "--stream-interval 8" in result.stdout.splitlines()[0]
    assert "stream-interval" not in result.stderr


def test_the_server_streams_the_first_token_then_n_at_a_time(tmp_path):
    folder = save_byte_model(tmp_path / "byte-llama")
    engine = LLMEngine(folder, block_size=8, num_gpu_blocks=64, stream_interval=4)
    with BackgroundServer(engine, "tiny", folder) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)
        stream = client.completions.create(model="tiny", prompt="Hello", max_tokens=11, temperature=0, stream=True,
                                           logprobs=0, extra_body={"ignore_eos": True})
        sizes = [len(c.choices[0].logprobs.tokens) for c in stream if c.choices and c.choices[0].logprobs]
    assert sizes == [1, 4, 4, 2]
