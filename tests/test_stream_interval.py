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


@pytest.mark.parametrize("counts,interval,sent", [
    ([1, 3, 1, 2, 4, 1], 4, [0, 2, 4, 5]),    # speculative steps: chunks close once 4 tokens have come
    ([3, 1, 1, 1, 1], 4, [0, 4]),             # a first step of several: sent at once, then 4 more
    ([1, 4, 4, 1], 4, [0, 1, 2, 3]),          # each step a chunk of its own
    ([1, 1, 1, 1, 1], 2, [0, 2, 4]),          # one each: the rule above
])
def test_the_times_a_client_gets_speculated_tokens_at(counts, interval, sent):
    times = [0.5 * i for i in range(len(counts))]
    assert streamed_times(times, interval, counts) == [times[i] for i in sent]
    if set(counts) == {1}:
        assert streamed_times(times, interval, counts) == streamed_times(times, interval)


def test_speculative_steps_stream_their_tokens_n_at_a_time(monkeypatch):
    # EAGLE-3 gives each step 1-4 tokens: a chunk goes out once 8 tokens have come since the last (vLLM
    # counts the answer's tokens), so ITL is a few steps, and TTFT, TPOT and E2E stay as they were
    import planner.sim.engine as sim_engine
    counts = []
    check = sim_engine.check_all_ended

    def keep(groups, total):
        counts.append({g.request_id: g.times.token_counts for g in groups})
        check(groups, total)
    monkeypatch.setattr(sim_engine, "check_all_ended", keep)
    deployments = [Deployment(model="llama-3.1-8b", gpu="h100-sxm", speculative="eagle:3", stream_interval=n)
                   for n in (1, 8)]
    every, chunked = [simulate(d, workload="sharegpt", rate=4, requests=60, seed=2).sim for d in deployments]
    assert every.steps == chunked.steps and counts[0] == counts[1]
    for one, eight in zip(every.requests, chunked.requests):
        steps = counts[0][one.request_id]
        assert eight.token_times == streamed_times(one.token_times, 8, steps)
        assert sum(steps or [1] * len(one.token_times)) == one.seq_output_len
    assert sum(any(c > 1 for c in steps or ()) for steps in counts[0].values()) > 50     # speculation ran
    one, eight = every.summary(), chunked.summary()
    for metric in ("ttft_mean", "tpot_mean", "e2e_mean", "request_throughput"):
        assert eight[metric] == one[metric]
    assert 2.5 * one["itl_mean"] < eight["itl_mean"] < 8.0 * one["itl_mean"]


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
