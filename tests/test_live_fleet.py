"""The live fleet (engine/entrypoints/router, planner/validation/fleet_live.py): the proxy routes by each
policy, aggregates /metrics as Prometheus would, reports a dead replica in one line; the in-process live
fleet routes as the simulated one; one end-to-end run of `planner serve --replicas 2` (slow)."""
from __future__ import annotations

import asyncio
import gc
import json
import math

import httpx
import pytest

from engine.core.block_keys import prompt_block_hashes
from engine.core.routing import parse_policy
from engine.entrypoints.openai.kv_events import KvEventLog
from engine.entrypoints.router import prometheus
from engine.entrypoints.router.proxy import Proxy, build_proxy_app
from serve_helpers import wait_until
from sim_helpers import ConstantCost

# It reads the wall clock (a live engine, a server, a time limit): scripts/test.sh runs it alone.
pytestmark = pytest.mark.serial

URLS = ["http://replica0", "http://replica1"]

PAGE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} {running}
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{model_name="m"}} {usage}
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{model_name="m"}} {prompt}
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{{model_name="m",le="0.5"}} {fast}
vllm:e2e_request_latency_seconds_bucket{{model_name="m",le="+Inf"}} {count}
vllm:e2e_request_latency_seconds_sum{{model_name="m"}} {total}
vllm:e2e_request_latency_seconds_count{{model_name="m"}} {count}
"""


class FakeReplicas:
    """Two replicas behind an httpx MockTransport: their pages, KV events and answers, and what they got."""

    def __init__(self) -> None:
        self.usage = [0.0, 0.0]
        self.events = [[], []]
        self.down: set[int] = set()
        self.status = 200
        self.got: list[int] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        i = URLS.index(f"http://{request.url.host}")
        if i in self.down:
            raise httpx.ConnectError("All connection attempts failed", request=request)
        path = request.url.path
        if path == "/metrics":
            return httpx.Response(200, text=PAGE.format(running=i + 1, usage=self.usage[i], prompt=10 * (i + 1),
                                                        fast=i, count=2 + i, total=1.5 + i))
        if path == "/kv_events":
            return httpx.Response(200, json={"enabled": True, "block_size": 4, "next": len(self.events[i]),
                                             "events": self.events[i][int(request.url.params["after"]):]})
        if path == "/health":
            return httpx.Response(503 if self.status != 200 else 200)
        if path in ("/tokenize", "/detokenize"):     # (what a replica was asked, echoed back)
            return httpx.Response(200, json={"replica": i, "path": path, "body": json.loads(request.content),
                                             "content_type": request.headers.get("content-type")})
        self.got.append(i)
        if self.status != 200:
            return httpx.Response(self.status, json={"error": {"message": "max_tokens: bad", "code": self.status}})
        return httpx.Response(200, json={"replica": i})


def run_proxy(policy: str, fake: FakeReplicas, calls):
    """Run `calls(client, proxy)` against a proxy over the fake replicas (no sockets)."""
    proxy = Proxy(URLS, parse_policy(policy), block_size=4)
    app = build_proxy_app(proxy)

    async def main():
        proxy.client = httpx.AsyncClient(transport=httpx.MockTransport(fake.handler))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as client:
            return await calls(client, proxy)
    return asyncio.run(main())


def post(client, prompt=(5, 6, 7, 8, 9, 10, 11, 12, 13), headers=None, **extra):
    return client.post("/v1/completions", json={"prompt": list(prompt), "max_tokens": 2, **extra}, headers=headers)


def test_tokenize_and_detokenize_go_to_a_replica_up_as_sent():
    fake = FakeReplicas()

    async def calls(client, proxy):
        fake.down.add(0)
        tokenized = await client.post("/tokenize", json={"prompt": "hello"})
        detokenized = await client.post("/detokenize", json={"tokens": [5, 6]})
        ping = await client.post("/ping")
        return tokenized, detokenized, ping, fake.got
    tokenized, detokenized, ping, routed = run_proxy("round-robin", fake, calls)
    assert tokenized.json() == {"replica": 1, "path": "/tokenize", "body": {"prompt": "hello"},
                                "content_type": "application/json"}
    assert detokenized.json()["path"] == "/detokenize" and detokenized.json()["body"] == {"tokens": [5, 6]}
    assert ping.status_code == 200 and routed == []      # (no generation routed)


def test_the_models_list_comes_from_a_replica_that_answers():
    fake = FakeReplicas()

    async def calls(client, proxy):
        fake.down.add(0)
        first_dead = await client.get("/v1/models")
        fake.down.add(1)
        none = await client.get("/v1/models")
        return first_dead, none
    first_dead, none = run_proxy("round-robin", fake, calls)
    assert first_dead.status_code == 200 and first_dead.json() == {"replica": 1}
    assert none.status_code == 503
    assert none.json()["error"]["message"] == ("no replica answered: replica 0 (http://replica0) did not answer: "
                                               "ConnectError; replica 1 (http://replica1) did not answer: ConnectError")


def test_a_pick_does_not_wait_long_on_a_replica_whose_kv_reading_hangs(monkeypatch):
    """A frozen replica (or one whose event loop is busy) answers no /metrics: each pick waits READ_DEADLINE at
    most from the reading's start, then scores it by its last reading; the other replica serves meanwhile."""
    from engine.entrypoints.router import replicas
    monkeypatch.setattr(replicas, "READ_DEADLINE", 0.3)
    fake = FakeReplicas()
    fake.usage = [0.5, 0.1]
    hang = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "replica1" and request.url.path == "/metrics" and hang.is_set():
            await asyncio.sleep(30)
        return fake.handler(request)

    async def main():
        proxy = Proxy(URLS, parse_policy("least-kv"), block_size=4)
        proxy.client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        app = build_proxy_app(proxy)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as client:
            first = (await post(client)).json()["replica"]          # replica 1 uses less of its cache
            hang.set()
            fake.usage = [0.0, 0.1]                                  # replica 0 is now the emptier
            loop = asyncio.get_running_loop()
            start = loop.time()
            picks = [(await post(client)).json()["replica"] for _ in range(3)]
            took = loop.time() - start
            for replica in proxy.replicas:
                if replica.reading is not None:
                    replica.reading.cancel()
            await proxy.client.aclose()
            return first, picks, took
    first, picks, took = asyncio.run(main())
    assert first == 1
    # replica 1 is scored by its last reading (0.1): replica 0's fresh 0.0 wins each pick
    assert picks == [0, 0, 0]
    assert took < 1.5                 # one wait of 0.3 s, not three, and nothing like the reading's 30 s


def test_the_launcher_tells_of_a_replica_that_exits_and_stops_the_router_when_none_is_left(tmp_path):
    import subprocess
    import sys
    import types

    from engine.entrypoints.router.launch import ExitWatch, ReplicaProcess

    def replica(i: int, code: str) -> ReplicaProcess:
        log = tmp_path / f"replica-{i}.log"
        log.write_text(f"serving\nreplica {i} failed: out of memory\n")
        return ReplicaProcess(i, f"http://127.0.0.1:{9000 + i}", subprocess.Popen([sys.executable, "-c", code]), log)
    dies = replica(0, "import sys; sys.exit(3)")
    lives = replica(1, "import time; time.sleep(60)")
    server = types.SimpleNamespace(should_exit=False)
    said: list[str] = []
    watch = ExitWatch([dies, lives], server, said.append, period=0.05)
    watch.start()
    dies.process.wait()
    assert wait_until(lambda: said, 10)
    assert said == [f"replica 0 exited (exit status 3): replica 0 failed: out of memory (log: {dies.log})"]
    assert not server.should_exit                       # replica 1 still serves
    lives.process.kill()
    watch.join(10)
    assert said[1].startswith("replica 1 exited (killed by signal 9)")
    assert watch.all_exited and server.should_exit       # nothing left: the router stops


def test_the_launcher_starts_a_replica_that_exits_again_up_to_its_cap(tmp_path):
    import sys
    import types

    from engine.entrypoints.router.launch import ExitWatch, ReplicaProcess

    log = tmp_path / "replica-0.log"
    log.write_text("")
    crashing = ReplicaProcess(0, "http://127.0.0.1:9000", None, log,
                              [sys.executable, "-c", "print('out of memory'); raise SystemExit(3)"])
    crashing.start()
    server = types.SimpleNamespace(should_exit=False)
    said: list[str] = []
    restarted: list[int] = []           # (the proxy marks it down then, and restores its adapters when it is up)
    watch = ExitWatch([crashing], server, said.append, restarted.append, period=0.05, restarts=2)
    watch.start()
    watch.join(20)
    assert restarted == [0, 0]
    assert [line.split("; ")[-1] for line in said[:2]] == ["starting it again (1 of 2)", "starting it again (2 of 2)"]
    assert said[2] == f"replica 0 exited (exit status 3): out of memory (log: {log})"       # the third time: gone
    assert crashing.restarts == 2 and watch.all_exited and server.should_exit
    assert log.read_text().count("out of memory") == 3          # every start's output, appended


def test_round_robin_takes_turns():
    fake = FakeReplicas()

    async def calls(client, proxy):
        return [(await post(client)).json()["replica"] for _ in range(4)]
    assert run_proxy("round-robin", fake, calls) == [0, 1, 0, 1]


def test_least_requests_counts_the_proxys_own_requests_in_flight():
    fake = FakeReplicas()

    async def calls(client, proxy):
        proxy.replicas[0].in_flight = 3          # three answers still streaming from replica 0
        first = (await post(client)).json()["replica"]
        after = [r.in_flight for r in proxy.replicas]
        return first, after
    first, after = run_proxy("least-requests", fake, calls)
    assert first == 1
    assert after == [3, 0]                       # the answered request is no longer in flight


def test_session_routing_reads_the_session_header():
    from engine.core.routing import session_owner
    fake = FakeReplicas()

    async def calls(client, proxy):
        proxy.replicas[0].in_flight = 3
        sessions = [(await post(client, headers={"X-Session-Id": f"user-{i}"})).json()["replica"] for i in range(8)]
        again = [(await post(client, headers={"x-session-id": f"user-{i}"})).json()["replica"] for i in range(8)]
        none = (await post(client)).json()["replica"]          # no session: the least loaded
        return sessions, again, none
    sessions, again, none = run_proxy("session", fake, calls)
    assert sessions == again == [session_owner(f"user-{i}", [0, 1]) for i in range(8)]
    assert set(sessions) == {0, 1} and none == 1


def test_least_kv_reads_each_replicas_metrics():
    fake = FakeReplicas()
    fake.usage = [0.9, 0.2]

    async def calls(client, proxy):
        return [(await post(client)).json()["replica"] for _ in range(2)]
    assert run_proxy("least-kv", fake, calls) == [1, 1]


def test_prefix_aware_follows_the_replicas_kv_events():
    fake = FakeReplicas()
    prompt = list(range(20, 33))                 # 13 tokens: 3 full blocks of 4 may hit
    hashes = prompt_block_hashes(prompt, 4)
    fake.events[1] = [[1, h] for h in hashes]     # replica 1 stored this prompt's blocks
    fake.events[0] = [[1, hashes[0]]]             # replica 0 only its first

    async def calls(client, proxy):
        picks = [(await post(client, prompt)).json()["replica"] for _ in range(2)]
        fake.events[1].append([0, hashes[0]])     # replica 1 evicts the first block: its run is broken
        picks.append((await post(client, prompt)).json()["replica"])
        return picks, len(proxy.replicas[1].held)
    picks, held = run_proxy("prefix-aware", fake, calls)
    assert picks == [1, 1, 0]
    assert held == len(hashes) - 1


def test_a_token_id_no_vocabulary_holds_scores_nothing_and_goes_on_to_the_replica():
    fake = FakeReplicas()

    async def calls(client, proxy):
        return [(await post(client, prompt)).status_code for prompt in ([2**70] * 20, [-1] * 20, [7] * 20)]
    assert run_proxy("prefix-aware", fake, calls) == [200, 200, 200]     # the replica judges the ids


def test_a_bad_request_gets_the_replicas_error_and_a_dead_replica_is_passed_over():
    fake = FakeReplicas()

    async def calls(client, proxy):
        fake.status = 400
        bad = await post(client)
        fake.status = 200
        fake.down.add(1)
        moved = [await post(client) for _ in range(3)]     # replica 1 refuses: each goes to replica 0
        health = await client.get("/health")
        models = await client.get("/v1/models")
        fake.down.add(0)
        dead = await post(client)
        none_up = await client.get("/health")
        counts = [(r.in_flight, r.routed, r.failed) for r in proxy.replicas]
        return bad, moved, dead, (health, models, none_up), counts
    bad, moved, dead, (health, models, none_up), counts = run_proxy("round-robin", fake, calls)
    assert bad.status_code == 400 and bad.json()["error"]["message"] == "max_tokens: bad"
    assert [(m.status_code, m.json()["replica"]) for m in moved] == [(200, 0)] * 3
    assert fake.got == [0, 0, 0, 0, 0]            # nothing reached replica 1 (the last: the models list)
    # One replica serves: the fleet is healthy but degraded, and lists its model.
    assert health.status_code == 200
    assert health.json() == {"status": "degraded", "unhealthy": ["replica 1 (http://replica1) is unreachable "
                                                                 "(ConnectError)"]}
    assert models.status_code == 200 and models.json() == {"replica": 0}
    assert none_up.status_code == 503 and "replica 0 (http://replica0) is unreachable" in none_up.json()["error"][
        "message"]
    assert dead.status_code == 502           # no replica to take it
    message = dead.json()["error"]["message"]
    assert "\n" not in message and "did not answer: ConnectError" in message
    # Nothing left in flight; each attempt counted where it was sent (round-robin still picks replica 1 in
    # turn: 1, then 2 + 1 + 2 for the three moved, 2 for the last), each refusal where it happened.
    assert [c[0] for c in counts] == [0, 0] and sum(c[1] for c in counts) == 1 + 5 + 2
    assert [c[2] for c in counts] == [1, 3]


def test_the_proxy_answers_what_it_cannot_forward_in_openais_shape():
    fake = FakeReplicas()

    async def calls(client, proxy):
        latin = await client.post("/v1/completions", content=b'{"prompt": [5], "max_tokens": 2}',
                                  headers={"content-type": "application/json", "accept": "\xff".encode("latin-1")})
        deep = await client.post("/v1/completions", content=b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
        missing = await client.get("/v1/embeddings")
        wrong_method = await client.get("/v1/completions")
        slash = await client.post("/v1/completions/", json={"prompt": [5]}, headers={"host": "evil.example.com"})
        long = await client.get("/" + "a" * 60_000)
        return latin, deep, missing, wrong_method, [r.in_flight for r in proxy.replicas], slash, long
    latin, deep, missing, wrong_method, in_flight, slash, long = run_proxy("least-requests", fake, calls)
    # a trailing slash is a 404 as the replicas answer it, no redirect built from the client's Host; a long
    # path is not echoed back whole
    assert slash.status_code == 404 and "location" not in slash.headers
    assert long.status_code == 404 and len(long.content) < 1_000
    assert latin.status_code == 200               # a latin-1 header byte goes on as it came
    assert deep.status_code == 200                # the replica judges a body the proxy cannot parse
    # in the replicas' own words (engine/entrypoints/openai/errors.py route_error), with the allowed methods
    assert missing.status_code == 404 and missing.json()["error"] == {
        "message": "no route /v1/embeddings", "type": "NotFoundError", "param": None, "code": 404}
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"
    assert wrong_method.json()["error"]["message"] == "GET is not allowed on /v1/completions"
    assert in_flight == [0, 0]


def test_the_proxy_refuses_a_body_over_the_servers_limit_before_holding_it():
    proxy = Proxy(URLS, parse_policy("round-robin"), block_size=4)
    app = build_proxy_app(proxy, max_body=1000)
    fake = FakeReplicas()

    async def main():
        proxy.client = httpx.AsyncClient(transport=httpx.MockTransport(fake.handler))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as client:
            return await post(client, prompt=range(1000))
    answer = asyncio.run(main())
    assert answer.status_code == 413 and "--max-request-body-size" in answer.json()["error"]["message"]
    assert fake.got == []


def test_metrics_sum_counters_and_histograms_and_keep_gauges_per_replica():
    fake = FakeReplicas()
    fake.usage = [0.25, 0.5]

    async def calls(client, proxy):
        await post(client)
        return (await client.get("/metrics")).text
    text = run_proxy("round-robin", fake, calls)
    page = prometheus.parse(text)
    assert page["vllm:prompt_tokens_total"].kind == "counter"
    assert [s[2] for s in page["vllm:prompt_tokens_total"].samples] == [30]
    hist = {(name, dict(labels).get("le")): value for name, labels, value in
            page["vllm:e2e_request_latency_seconds"].samples}
    assert hist == {("vllm:e2e_request_latency_seconds_bucket", "0.5"): 1,
                    ("vllm:e2e_request_latency_seconds_bucket", "+Inf"): 5,
                    ("vllm:e2e_request_latency_seconds_sum", None): 4.0,
                    ("vllm:e2e_request_latency_seconds_count", None): 5}
    usage = {dict(labels)["replica"]: value for _, labels, value in page["vllm:kv_cache_usage_perc"].samples}
    assert usage == {"0": 0.25, "1": 0.5}
    routed = {dict(labels)["replica"]: value for _, labels, value in page["planner:router_requests_total"].samples}
    assert routed == {"0": 1, "1": 0}
    assert 'vllm:kv_cache_usage_perc{model_name="m",replica="1"} 0.5' in text


def test_kv_event_log_hands_out_events_then_a_snapshot_to_a_reader_too_far_behind():
    class Pool:
        events = None

    class Engine:
        class allocator:
            enable_prefix_caching = True
            block_size = 16
            gpu = Pool()
    log = KvEventLog(Engine, kept=3)
    Engine.allocator.gpu.events += [(True, 11), (True, 12)]
    log.drain()
    assert log.since(0)["events"] == [[1, 11], [1, 12]]
    Engine.allocator.gpu.events += [(False, 11), (True, 13)]
    log.drain()
    assert log.since(2)["events"] == [[0, 11], [1, 13]] and log.since(2)["next"] == 4
    behind = log.since(0)                       # event 0 is no longer kept
    assert "events" not in behind and sorted(behind["snapshot"]) == [12, 13]


def test_the_live_and_simulated_routers_are_one_pick_rule():
    from engine.core.routing import BaseRouter
    from engine.entrypoints.router.replicas import LiveRouter
    from planner.sim.router import Router
    assert issubclass(Router, BaseRouter) and issubclass(LiveRouter, BaseRouter)
    assert Router.pick is not BaseRouter.pick and LiveRouter.pick is BaseRouter.pick
    assert Router.scores is BaseRouter.scores and LiveRouter.scores is BaseRouter.scores


@pytest.fixture(scope="module")
def prefix_trace_file(tmp_path_factory):
    """10 requests over 3 prefixes of 32 tokens, one every 2 s: each ends before the next arrives, so a
    router's state at every arrival is the same live and simulated, whatever the step times."""
    from workloads import make_trace
    trace = make_trace("prefix", num_requests=10, rate=math.inf, num_prefixes=3, prefix_len=32, seed=1)
    path = tmp_path_factory.mktemp("trace") / "prefix.jsonl"
    trace.retimed(arrival="constant", rate=0.5, seed=1).save(path)
    return str(path)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from tiny_models import save_tiny_model
    return save_tiny_model("llama", tmp_path_factory.mktemp("llama"))


@pytest.mark.parametrize("router", ["round-robin", "least-requests", "least-kv", "prefix-aware"])
def test_the_live_fleet_routes_as_the_simulated_fleet(llama_dir, prefix_trace_file, tmp_path, router):
    from engine.deployment import Deployment
    from planner.validation.fleet import validate_fleet, write_fleet_report
    from planner.validation.spec import ValidationSpec
    deployment = Deployment(model=llama_dir, gpu="cpu", block_size=16, enable_prefix_caching=True)
    spec = ValidationSpec(deployment, workload=prefix_trace_file, rate=math.inf, requests=10, length_scale=1.0,
                          max_prompt_len=64, max_output_len=4, seeds=0, kv_cache_memory_bytes=1 << 22)
    result = validate_fleet(spec, 2, parse_policy(router), cost_model=ConstantCost())
    assert result.live.metrics["num_completed"] == result.sim.metrics["num_completed"] == 10
    assert result.live.routes == result.sim.fleet.routes
    if router != "prefix-aware":                 # every request ended before the next: equal replicas take turns
        assert result.live.routes == [i % 2 for i in range(10)]
    else:                                         # each prefix stays on the replica that first served it
        assert result.live.prefix_cache_hit_rate == pytest.approx(result.sim.prefix_cache_hit_rate)
        assert result.live.prefix_cache_hit_rate > 0.3
    doc = json.loads(write_fleet_report(result, tmp_path).read_text())
    assert [row["difference_pp"] for row in doc["split"]] == [0, 0]
    assert doc["metrics"]["request_throughput"]["target"] == 0.05
    assert "| replica | live share |" in (tmp_path / "report.md").read_text()


def test_the_live_fleet_routes_sessions_as_the_simulated_fleet(llama_dir, tmp_path):
    # `session`: each conversation's turns on the replica its id hashes to, live as simulated
    from engine.core.routing import session_owner
    from engine.deployment import Deployment
    from planner.validation.fleet import validate_fleet
    from planner.validation.spec import ValidationSpec
    from workloads import make_trace
    trace = make_trace("chatbot", num_requests=8, rate=math.inf, seed=3)
    trace.retimed(arrival="constant", rate=0.5, seed=1).save(tmp_path / "chat.jsonl")
    spec = ValidationSpec(Deployment(model=llama_dir, gpu="cpu", block_size=16, enable_prefix_caching=True),
                          workload=str(tmp_path / "chat.jsonl"), rate=math.inf, requests=8, length_scale=1.0,
                          max_prompt_len=64, max_output_len=4, seeds=0, kv_cache_memory_bytes=1 << 22)
    result = validate_fleet(spec, 2, parse_policy("session"), cost_model=ConstantCost())
    assert result.live.metrics["num_completed"] == result.sim.metrics["num_completed"] == 8
    assert result.live.routes == result.sim.fleet.routes
    owners = [session_owner(r.conversation_id, [0, 1]) for r in trace.requests]
    assert result.live.routes == owners and len(set(owners)) == 2
    assert len({r.conversation_id for r in trace.requests}) < 8          # (some conversations have turns)


@pytest.mark.parametrize("router", ["round-robin", "least-requests"])
def test_a_closed_loop_fleet_sends_each_request_as_one_ends_live_and_simulated(llama_dir, router):
    # One client: each request is sent when the one before ends, stamped then, live and simulated alike. The
    # replica that just ended one still counts it in flight at that instant (ended before now, strictly), so
    # least-requests takes turns as round-robin does.
    from engine.deployment import Deployment
    from planner.validation.fleet import validate_fleet
    from planner.validation.spec import ValidationSpec
    spec = ValidationSpec(Deployment(model=llama_dir, gpu="cpu", block_size=16), workload="alpaca", concurrency=1,
                          requests=6, length_scale=1.0, max_prompt_len=32, max_output_len=4, seeds=0,
                          kv_cache_memory_bytes=1 << 22)
    gc.disable()      # a collection of pytest's heap inside a step would part its finish from its end
    try:
        result = validate_fleet(spec, 2, parse_policy(router), cost_model=ConstantCost())
    finally:
        gc.enable()
    assert result.live.metrics["num_completed"] == result.sim.metrics["num_completed"] == 6
    assert result.live.routes == result.sim.fleet.routes == [0, 1, 0, 1, 0, 1]
    for records, slack in ((result.live.requests, 0.002), (result.sim.requests, 0.0)):
        assert records[0].arrival == 0.0
        assert all(0 <= b.arrival - a.finish <= slack for a, b in zip(records, records[1:]))
    doc = result.document()
    assert doc["concurrency"] == 1 and doc["rate"] is None


def test_a_fleet_profiled_along_its_run_times_the_model_its_replicas_share(llama_dir, tmp_path, monkeypatch):
    from engine.deployment import Deployment
    from planner.profile import along
    from planner.profile.run import ProfileOptions
    from planner.validation.fleet import validate_fleet
    from planner.validation.spec import ValidationSpec
    grid = dict(prefill_tokens=[8, 32], prefill_seqs=[1], decode_batch=[1, 4], decode_context=[16, 64],
                host_batch=[1, 8], block_counts=[1, 4], warmup=1)
    fresh = along.ProfileAlong(ProfileOptions(Deployment(model=llama_dir, gpu="cpu"), quick=True, repeats=2,
                                              grid_overrides=grid), tmp_path / "p.json", span_s=1e-3,
                               say=lambda *_: None)
    start, beside = fresh.before_steps, []
    fresh.before_steps = lambda runner: beside.append(runner) or start(runner)
    monkeypatch.setattr(along, "profile_for_live_run", lambda *args, **kwargs: fresh)
    spec = ValidationSpec(Deployment(model=llama_dir, gpu="cpu"), workload="alpaca", rate=math.inf, requests=6,
                          length_scale=0.2, max_prompt_len=32, max_output_len=4, seeds=0)
    result = validate_fleet(spec, 2, parse_policy("round-robin"), reprofile=True)
    assert len(beside) == 1 and beside[0].model_path == llama_dir          # one replica's runner, once
    # The replicas are identical devices: they run one loaded model, each on a KV cache of its own.
    runners = [r.engine.runner for r in result.live.replicas]
    assert all(r.model is beside[0].model for r in runners) and runners[0].kv_cache is not runners[1].kv_cache
    assert result.live.metrics["num_completed"] == result.sim.metrics["num_completed"] == 6
    assert "between the live run's steps" in result.profile_note


@pytest.mark.slow
def test_serve_two_replicas_end_to_end(tmp_path):
    """`planner serve --replicas 2` with a tiny random model: bench through the proxy, the metrics add up,
    a bad request gets the replica's 400, SIGTERM drains and stops every process."""
    import signal
    import subprocess
    import sys

    from serve_helpers import metric, save_byte_model, wait_until

    from engine.entrypoints.openai.server import free_port

    PLANNER[0] = sys.executable
    folder = save_byte_model(tmp_path / "model")
    port = free_port()
    serve = subprocess.Popen([*PLANNER, "serve", "--model", folder, "--replicas", "2",
                              "--router", "least-requests", "--port", str(port), "--device", "cpu"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_until(lambda: _ok(url + "/health"), timeout=180), serve.stdout.read() if serve.poll() else ""
        bench = subprocess.run([*PLANNER, "bench", "--endpoint", url, "--workload",
                                "alpaca", "--requests", "8", "--rate", "20", "--max-prompt-len", "24",
                                "--max-output-len", "6", "--json", "--out", str(tmp_path / "bench")],
                               capture_output=True, text=True, timeout=300)
        assert bench.returncode == 0, bench.stderr
        assert json.loads(bench.stdout)["num_completed"] == 8
        bad = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 0}, timeout=30)
        assert bad.status_code == 400 and "max_tokens" in bad.json()["error"]["message"]
        text = httpx.get(url + "/metrics", timeout=30).text
        assert metric(text, "planner:router_requests_total") == 9
        assert min(metric(text, "planner:router_requests_total", replica=str(i)) for i in (0, 1)) >= 2
        assert metric(text, "vllm:e2e_request_latency_seconds_count") == 8
        assert metric(text, "vllm:num_requests_running", replica="1") == 0
        replica_urls = [line.split()[-1] for line in _ready_line(serve).split(": ", 1)[1].split(" (")[0].split(", ")]
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=90) == 0
        assert not any(_ok(u + "/health") for u in replica_urls)
    finally:
        if serve.poll() is None:
            serve.kill()


PLANNER = ["python", "-c", "from planner.cli.app import main; main()"]


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _ready_line(process) -> str:
    """The "2 replicas ready: URL, URL (logs in ...)" line serve printed."""
    for line in process.stdout:
        if "replicas ready" in line:
            return line.strip()
    raise AssertionError("serve never said its replicas were ready")


def test_a_fleet_serving_lora_adapters_routes_each_prompt_by_its_adapters_blocks_live_and_simulated(
        llama_dir, tmp_path):
    # The prefix trace's requests over 2 adapters: a prompt's cached blocks are its adapter's, so prefix-aware
    # routing follows (prefix, adapter) pairs, on the live replicas (random adapters loaded on each) as simulated.
    from engine.deployment import Deployment
    from planner.validation.fleet import validate_fleet
    from planner.validation.spec import ValidationSpec
    from workloads import make_trace
    path = tmp_path / "prefix-lora.jsonl"
    make_trace("prefix", num_requests=12, rate=math.inf, num_prefixes=2, prefix_len=32, seed=1, loras=2,
               lora_assignment="round-robin").retimed(arrival="constant", rate=0.5, seed=1).save(path)
    deployment = Deployment(model=llama_dir, gpu="cpu", block_size=16, enable_prefix_caching=True,
                            enable_lora=True, max_loras=2, max_lora_rank=8)
    spec = ValidationSpec(deployment, workload=str(path), rate=math.inf, requests=12, length_scale=1.0,
                          max_prompt_len=64, max_output_len=4, seeds=0, kv_cache_memory_bytes=1 << 22)
    result = validate_fleet(spec, 2, parse_policy("prefix-aware"), cost_model=ConstantCost())
    assert result.live.metrics["num_completed"] == result.sim.metrics["num_completed"] == 12
    assert result.live.routes == result.sim.fleet.routes
    assert result.live.prefix_cache_hit_rate == pytest.approx(result.sim.prefix_cache_hit_rate)
    assert result.live.prefix_cache_hit_rate > 0.3
