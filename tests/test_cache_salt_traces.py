"""Tenants in a trace: requests salted with vLLM's cache_salt share cached blocks only within their tenant,
in the simulator, the live engine, a live fleet's routing and the requests `planner bench` sends."""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace

import pytest
from pydantic import ValidationError

from engine.deployment import Deployment
from sim_helpers import ConstantCost
from workloads import Trace, TraceError, TraceRequest, make_trace


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from tiny_models import save_tiny_model
    return save_tiny_model("llama", tmp_path_factory.mktemp("llama"))


def test_tenants_salt_each_conversation_with_one_tenant_drawn_by_the_seed():
    trace = make_trace("chatbot", num_requests=80, rate=2.0, tenants=3, seed=5)
    by_conversation = defaultdict(set)
    for r in trace:
        by_conversation[r.conversation_id].add(r.cache_salt)
    assert all(len(salts) == 1 for salts in by_conversation.values())       # a conversation keeps its tenant
    assert set().union(*by_conversation.values()) == {"tenant-1", "tenant-2", "tenant-3"}
    assert trace.stats()["num_cache_salts"] == 3
    assert make_trace("chatbot", num_requests=80, rate=2.0, tenants=3, seed=5) == trace
    # lengths and arrivals come from their own streams: salting changes nothing else
    plain = make_trace("chatbot", num_requests=80, rate=2.0, seed=5)
    assert [r.model_copy(update={"cache_salt": None}) for r in trace] == plain.requests
    assert all(r.cache_salt is None for r in plain) and "num_cache_salts" not in plain.stats()


def test_a_salt_is_a_non_empty_string_and_survives_a_trace_file(tmp_path):
    with pytest.raises(ValidationError, match="cache_salt"):
        TraceRequest(request_id="a", arrival_time=0, prompt_len=4, output_len=2, cache_salt="")
    with pytest.raises(TraceError, match="tenants"):
        make_trace("alpaca", num_requests=4, rate=1.0, tenants=-1)
    trace = make_trace("prefix", num_requests=12, rate=4.0, tenants=2, seed=1)
    for suffix in (".jsonl", ".csv"):
        assert Trace.load(trace.save(tmp_path / f"t{suffix}")).requests == trace.requests
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"request_id": "a", "arrival_time": 0, "prompt_len": 4, "output_len": 2, "cache_salt": 7}\n')
    with pytest.raises(TraceError, match="cache_salt"):
        Trace.load(bad)


def test_every_tenant_computes_the_shared_prefix_once_in_the_simulator():
    from planner.api import simulate

    def hits(tenants: int) -> int:
        # one 341-token prefix, requests far apart: each request finds what every earlier one cached
        result = simulate(Deployment(model="llama-3.1-8b", gpu="h100", enable_prefix_caching=True),
                          workload="prefix", params={"shots": 5, "tenants": tenants}, rate=0.5, requests=40)
        return result.sim.prefix_cache_hit_tokens

    unsalted, one, four = hits(0), hits(1), hits(4)
    assert one == unsalted                     # one tenant: all its requests share, as unsalted ones do
    trace = make_trace("prefix", num_requests=40, rate=0.5, shots=5, tenants=4)
    first = {r.cache_salt for r in trace}
    prefix_blocks = trace.requests[0].prefix_len // 16
    assert unsalted - four == (len(first) - 1) * prefix_blocks * 16    # each further tenant misses it once


@pytest.mark.serial     # a live engine on the wall clock: run alone (scripts/test.sh)
def test_the_live_engine_and_the_simulator_hit_the_same_salted_blocks(llama_dir):
    from planner.validation.run import validate
    from planner.validation.spec import ValidationSpec
    deployment = Deployment(model=llama_dir, gpu="cpu", block_size=8, max_num_seqs=4, max_model_len=96,
                            enable_prefix_caching=True)
    spec = ValidationSpec(deployment, workload="prefix", params=(("num_prefixes", 2), ("prefix_len", 32),
                                                                 ("tenants", 3)),
                          rate=math.inf, requests=12, length_scale=1.0, max_prompt_len=64, max_output_len=4,
                          seeds=0)
    v = validate(spec, cost_model=ConstantCost())
    live = [(s.batch_size, s.prefill_tokens, s.decode_tokens) for s in v.live.steps]
    assert live == [(s.batch_size, s.prefill_tokens, s.decode_tokens) for s in v.sim_steps]
    # a prompt's tokens found cached are not prefilled: the live engine's prefills say what it hit
    prompts = sum(r.prompt_len for r in spec.trace())

    def hit(run) -> int:
        return prompts - sum(s.prefill_tokens for s in run.live.steps)

    assert hit(v) == v.simulated["prefix_cache_hit_tokens"] > 0
    unsalted = validate(replace(spec, params=spec.params[:2]), cost_model=ConstantCost())
    assert hit(unsalted) == unsalted.simulated["prefix_cache_hit_tokens"] > hit(v)


@pytest.mark.serial     # a live engine on the wall clock: run alone (scripts/test.sh)
def test_a_live_fleet_routes_each_tenants_prompts_by_their_salted_blocks_as_simulated(llama_dir, tmp_path):
    from engine.core.routing import parse_policy
    from planner.validation.fleet import validate_fleet
    from planner.validation.spec import ValidationSpec
    path = tmp_path / "prefix-tenants.jsonl"
    make_trace("prefix", num_requests=12, rate=math.inf, num_prefixes=2, prefix_len=32, seed=1,
               tenants=2).retimed(arrival="constant", rate=0.5, seed=1).save(path)
    deployment = Deployment(model=llama_dir, gpu="cpu", block_size=16, enable_prefix_caching=True)
    spec = ValidationSpec(deployment, workload=str(path), rate=math.inf, requests=12, length_scale=1.0,
                          max_prompt_len=64, max_output_len=4, seeds=0, kv_cache_memory_bytes=1 << 22)
    result = validate_fleet(spec, 2, parse_policy("prefix-aware"), cost_model=ConstantCost())
    assert result.live.routes == result.sim.fleet.routes
    assert result.live.prefix_cache_hit_rate == pytest.approx(result.sim.prefix_cache_hit_rate)
    assert result.live.prefix_cache_hit_rate > 0.2
