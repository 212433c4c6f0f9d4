"""LoRA adapters over HTTP: `planner serve --enable-lora --lora-modules NAME=PATH ...` and `planner bench
--lora-modules NAME ...`, as vLLM's server and bench take them.

A request whose `model` is an adapter's name must answer what the in-process engine answers for that
adapter (tests/test_engine_lora.py checks the engine itself against transformers).
"""
from __future__ import annotations

import csv
import json
import random
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from typer.testing import CliRunner

from engine import LLM, LLMEngine, SamplingParams
from engine.core.block_keys import cache_root, prompt_block_hashes
from engine.core.routing import parse_policy
from engine.entrypoints.openai.served_models import LoRAModulePath, ServedModels, parse_lora_modules
from engine.entrypoints.openai.server import BackgroundServer
from engine.entrypoints.router.proxy import Proxy
from engine.lora import LoRARequest
from lora_helpers import save_adapter
from planner.bench.client import BenchConfig, request_models
from planner.cli.app import app
from serve_helpers import engine_idle, metric, save_byte_model, sse_events, wait_until
from tiny_models import hf_model
from workloads import Trace, TraceRequest

MODEL = "tiny"
LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA = {"enable_lora": True, "max_loras": 2, "max_lora_rank": 8}
PROMPTS = [[72, 101, 108, 108, 111, 32, 116], [87, 111, 114, 108, 100], [65, 98, 99, 100, 101, 102, 103, 104],
           [49, 50, 51]]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The byte-level tiny llama and two adapters of another rank and other targets: "sql" (id 1), "chat" (2)."""
    root = tmp_path_factory.mktemp("serve-lora")
    folder = save_byte_model(root / "model")
    base = hf_model(folder)
    modules = [LoRAModulePath("sql", save_adapter(root / "sql", base, LLAMA_TARGETS, seed=1)),
               LoRAModulePath("chat", save_adapter(root / "chat", base, ["q_proj", "v_proj", "down_proj"], r=4,
                                                   alpha=8, seed=2))]
    return folder, modules


@pytest.fixture(scope="module")
def server(setup):
    folder, modules = setup
    engine = LLMEngine(folder, block_size=8, num_gpu_blocks=128, max_num_seqs=16, **LORA)
    with BackgroundServer(engine, MODEL, folder, lora_modules=modules) as srv:
        yield srv


def reference(setup) -> dict[str, list[str]]:
    """Each model name's greedy texts for PROMPTS, from the in-process LLM with that adapter."""
    folder, modules = setup
    llm = LLM(folder, block_size=8, num_gpu_blocks=128, **LORA)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    loras = {MODEL: None} | {m.name: LoRARequest(m.name, i, m.path) for i, m in enumerate(modules, start=1)}
    return {name: [o.outputs[0].text for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params,
                                                           use_tqdm=False, lora_request=lora)]
            for name, lora in loras.items()}


def complete(server, model: str, prompt, **extra) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    return httpx.post(f"{server.url}/v1/completions", json=body | extra, timeout=60)


def test_each_model_name_runs_its_adapter_as_the_engine_does(server, setup):
    expected = reference(setup)
    # the adapters change what the model says, else the comparison proves nothing
    assert expected["sql"] != expected[MODEL] and expected["chat"] != expected[MODEL]
    asked = [(name, i) for i in range(len(PROMPTS)) for name in expected]
    with ThreadPoolExecutor(len(asked)) as pool:     # at once: the steps mix adapters and the base model
        answers = list(pool.map(lambda job: complete(server, job[0], PROMPTS[job[1]]), asked))
    for (name, i), answer in zip(asked, answers):
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["text"] == expected[name][i], (name, i)
        assert answer.json()["model"] == name          # vLLM answers with the adapter's name
    streamed = complete(server, "chat", PROMPTS[0], stream=True)
    chunks = [json.loads(e) for e in sse_events(streamed) if e != "[DONE]"]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == expected["chat"][0]
    assert {c["model"] for c in chunks} == {"chat"}
    assert wait_until(lambda: engine_idle(server.engine))


def test_models_lists_the_adapters_with_their_parent(server, setup):
    _, modules = setup
    data = httpx.get(f"{server.url}/v1/models").json()["data"]
    assert [(d["id"], d["root"], d["parent"]) for d in data] == [
        (MODEL, MODEL, None), ("sql", modules[0].path, MODEL), ("chat", modules[1].path, MODEL)]
    # ids 1, 2, ... in the order given, every adapter loaded at start
    assert [lora.lora_int_id for lora in server.state.models.adapters.values()] == [1, 2]
    assert server.engine.list_loras() == {1, 2}


def test_an_unknown_model_is_vllms_404(server):
    answer = complete(server, "sql2", "hi")
    assert answer.status_code == 404
    assert answer.json()["error"] == {"message": "The model `sql2` does not exist.", "type": "NotFoundError",
                                      "param": "model", "code": 404}
    chat = httpx.post(f"{server.url}/v1/chat/completions",
                      json={"model": "nope", "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 404 and chat.json()["error"]["message"] == "The model `nope` does not exist."


# -- --lora-modules and start-up refusals ---------------------------------------------------------------
def test_lora_modules_are_vllms_name_path_pairs_or_json():
    assert parse_lora_modules(["a=/x/a", "", '{"name": "b", "path": "/x/b", "base_model_name": "m"}']) == [
        LoRAModulePath("a", "/x/a"), LoRAModulePath("b", "/x/b", "m")]
    for bad, why in (("a", "give NAME=PATH"), ("=/x", "give NAME=PATH"), ('{"name": "a"', "not valid JSON"),
                     ('{"name": "a", "path": "/x", "rank": 8}', "unknown field(s) rank"),
                     ('{"name": "", "path": "/x"}', "'name' must be a non-empty string")):
        with pytest.raises(ValueError) as caught:
            parse_lora_modules([bad])
        assert why in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(ValueError, match="names the adapter 'a' twice"):
        ServedModels(MODEL, [LoRAModulePath("a", "/x"), LoRAModulePath("a", "/y")])
    with pytest.raises(ValueError, match="has the served model's name"):
        ServedModels(MODEL, [LoRAModulePath(MODEL, "/x")])


def serve(*args) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["serve", "--port", "1", *args])
    return result.exit_code, result.stderr


def test_serve_refuses_bad_lora_flags_in_one_line(setup):
    folder, modules = setup
    sql = f"sql={modules[0].path}"
    code, err = serve("--model", folder, "--lora-modules", sql)
    assert code == 2 and err == "error: --lora-modules serves LoRA adapters: give --enable-lora too (as vLLM " \
                                "requires)\n"
    code, err = serve("--model", folder, "--enable-lora", "--lora-modules", sql, "chat")
    assert code == 2 and "--lora-modules 'chat': give NAME=PATH" in err and err.count("\n") == 1
    code, err = serve("--model", folder, "--enable-lora", "--lora-modules", "a=/x", "--lora-modules", "b=/y", "c=/z")
    assert code == 2 and "not both" in err and err.count("\n") == 1
    code, err = serve("--model", folder, "stray")
    assert code == 2 and err == "error: unexpected argument(s): stray\n"


def test_serve_refuses_an_adapter_the_engine_cannot_serve_at_start(setup, tmp_path):
    """The model loads, then the second adapter of `--lora-modules a b` fails: the engine's words, one line."""
    folder, modules = setup
    wide = save_adapter(tmp_path / "wide", hf_model(folder), LLAMA_TARGETS, r=16)
    code, err = serve("--model", folder, "--enable-lora", "--max-lora-rank", "8", "--device", "cpu",
                      "--port", str(_free_port()), "--lora-modules", f"sql={modules[0].path}", f"wide={wide}")
    # (after the "loading MODEL ..." line)
    assert code == 2 and err.splitlines()[:-1] == [f"loading {folder} ..."] and "Traceback" not in err
    last = err.splitlines()[-1]
    assert last.startswith("error: LoRA adapter 'wide'") and "LoRA rank 16 is greater than max_lora_rank 8" in last
    code, err = serve("--model", folder, "--enable-lora", "--device", "cpu", "--port", str(_free_port()),
                      "--lora-modules", f"gone={tmp_path / 'gone'}")
    last = err.splitlines()[-1]
    assert code == 2 and last.startswith("error: LoRA adapter 'gone'") and "no such folder" in last


def _free_port() -> int:
    from engine.entrypoints.openai.server import free_port
    return free_port()


# -- bench ------------------------------------------------------------------------------------------------
def trace_of(loras: list[int]) -> Trace:
    return Trace([TraceRequest(request_id=f"r{i}", arrival_time=0.0, prompt_len=4, output_len=2, lora=k)
                  for i, k in enumerate(loras)])


def test_bench_picks_each_requests_name_as_vllm_bench_does():
    names = ("a", "b", "c")
    plain = trace_of([0] * 7)
    config = BenchConfig("http://x", lora_modules=names, seed=5)
    draw = random.Random(5)
    assert request_models(plain, config) == [draw.choice(names) for _ in range(7)]     # vLLM's random.choice
    robin = BenchConfig("http://x", lora_modules=names, lora_assignment="round-robin")
    assert request_models(plain, robin) == ["a", "b", "c", "a", "b", "c", "a"]
    assert request_models(plain, BenchConfig("http://x")) == [None] * 7                # the base model
    # a trace's own adapters win: lora k is the k-th name, 0 the base model
    assert request_models(trace_of([2, 0, 1, 3]), config) == ["b", None, "a", "c"]


@pytest.mark.parametrize("loras, config, why", [
    ([1, 3], {"lora_modules": ("a", "b")}, "run LoRA adapter 3, but --lora-modules names 2"),
    ([1], {}, "name them with --lora-modules"),
    ([1], {"lora_modules": ("a",), "lora_assignment": "random"}, "this trace's requests carry their own"),
])
def test_bench_refuses_adapters_it_cannot_name(loras, config, why):
    with pytest.raises(ValueError) as caught:
        request_models(trace_of(loras), BenchConfig("http://x", **config))
    assert why in str(caught.value)
    with pytest.raises(ValueError, match="give them too"):
        BenchConfig("http://x", lora_assignment="round-robin")
    with pytest.raises(ValueError, match="choose one of random, round-robin"):
        BenchConfig("http://x", lora_modules=("a",), lora_assignment="zipf")


def bench(server, out, *args):
    return CliRunner().invoke(app, ["bench", "--endpoint", server.url, "--workload", "random", "-p", "input_len=6",
                                    "-p", "output_len=2", "--requests", "6", "--prompt-format", "tokens",
                                    "--out", str(out), "--json", *args])


def test_bench_sends_each_requests_adapter_to_the_server(server, tmp_path):
    own = bench(server, tmp_path / "own", "-p", "loras=2", "-p", "lora_assignment=round-robin",
                "--lora-modules", "sql", "chat")
    assert own.exit_code == 0, own.output
    assert json.loads(own.stdout)["num_completed"] == 6
    rows = list(csv.DictReader((tmp_path / "own" / "requests.csv").open()))
    assert [r["model"] for r in rows] == ["sql", "chat"] * 3
    robin = bench(server, tmp_path / "robin", "--lora-modules", "chat", MODEL, "sql", "--lora-assignment",
                  "round-robin")
    assert robin.exit_code == 0, robin.output
    doc = json.loads(robin.stdout)
    assert doc["num_completed"] == 6 and doc["lora_modules"] == ["chat", MODEL, "sql"]
    rows = list(csv.DictReader((tmp_path / "robin" / "requests.csv").open()))
    assert [r["model"] for r in rows] == ["chat", MODEL, "sql"] * 2
    short = bench(server, tmp_path / "short", "-p", "loras=3", "-p", "lora_assignment=round-robin",
                  "--lora-modules", "sql", "chat")
    assert short.exit_code == 2 and short.stderr.count("\n") == 1
    assert "run LoRA adapter 3, but --lora-modules names 2" in short.stderr
    assert wait_until(lambda: engine_idle(server.engine))


@pytest.mark.slow
def test_a_fleet_serves_the_adapters_on_every_replica(setup):
    """`planner serve --replicas 2 --lora-modules ...`: each replica loads the adapters, the proxy forwards a
    request's `model`, and an adapter that cannot be served stops the fleet's start in one line. An adapter
    loaded through the proxy while the fleet runs ($VLLM_ALLOW_RUNTIME_LORA_UPDATING) is loaded on both, and
    on a replica that is killed and started again before it serves requests again."""
    import os
    import signal
    import subprocess
    import sys

    folder, modules = setup
    planner = [sys.executable, "-c", "from planner.cli.app import main; main()"]
    port = _free_port()
    fleet = subprocess.Popen([*planner, "serve", "--model", folder, "--replicas", "2", "--port", str(port),
                              "--device", "cpu", "--enable-lora", "--max-lora-rank", "8", "--lora-modules",
                              f"{modules[0].name}={modules[0].path}"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env=os.environ | {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        ready = next(line for line in fleet.stderr if "replicas ready" in line)
        second = ready.split(": ", 1)[1].split(" (")[0].split(", ")[1]
        assert wait_until(lambda: _answers(url + "/health"), timeout=180)
        chat = {"lora_name": "chat", "lora_path": modules[1].path}
        loaded = httpx.post(url + "/v1/load_lora_adapter", json=chat, timeout=60)
        assert (loaded.status_code, loaded.text) == (200, "Success: LoRA adapter 'chat' added successfully.")
        again = httpx.post(url + "/v1/load_lora_adapter", json=chat, timeout=60)   # each replica's own 400
        assert again.status_code == 400 and "has already been loaded" in again.json()["error"]["message"]
        assert [d["id"] for d in httpx.get(url + "/v1/models").json()["data"]] == [folder, "sql", "chat"]
        expected = reference(setup)
        for name in ("sql", "chat", folder):       # round-robin: each name on both replicas over two prompts
            for i in (0, 1):
                body = {"model": name, "prompt": PROMPTS[i], "max_tokens": MAX_TOKENS, "temperature": 0,
                        "ignore_eos": True}
                answer = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
                assert answer["choices"][0]["text"] == expected.get(name, expected[MODEL])[i]
        # replica 1 killed: the launcher starts it again, and the proxy loads "chat" on it before it is up
        os.kill(_pid_listening_on(second), signal.SIGKILL)

        def replica_1(name: str) -> float:
            return metric(httpx.get(url + "/metrics", timeout=30).text, name, replica="1")
        assert wait_until(lambda: replica_1("planner:router_replica_down_total") == 1, timeout=60)
        assert wait_until(lambda: replica_1("planner:router_replica_up") == 1, timeout=180)
        assert [d["id"] for d in httpx.get(second + "/v1/models").json()["data"]] == [folder, "sql", "chat"]
        body = {"model": "chat", "prompt": PROMPTS[2], "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
        answer = httpx.post(second + "/v1/completions", json=body, timeout=60).json()
        assert answer["choices"][0]["text"] == expected["chat"][2]
    finally:
        fleet.send_signal(signal.SIGTERM)      # drains the proxy, then every replica
        try:
            fleet.wait(timeout=90)
        except subprocess.TimeoutExpired:
            fleet.kill()
    bad = subprocess.run([*planner, "serve", "--model", folder, "--replicas", "2", "--port", str(_free_port()),
                          "--device", "cpu", "--enable-lora", "--lora-modules", f"gone={folder}/gone"],
                         capture_output=True, text=True, timeout=180)
    assert bad.returncode == 2
    assert re.match(r"error: replica \d exited while starting: LoRA adapter 'gone' .*: no such folder",
                    bad.stderr.splitlines()[-1])


def _pid_listening_on(url: str) -> int:
    """The replica process serving `url` (its command line holds its config's port)."""
    import pathlib

    port = f'"port": {url.rsplit(":", 1)[1]}'
    for cmdline in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "engine.entrypoints.openai.replica" in words and port in words:
            return int(cmdline.parent.name)
    raise AssertionError(f"no replica process serves {url}")


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_fleets_prefix_aware_proxy_scores_a_prompt_under_its_adapters_block_keys():
    """A replica keys an adapter's blocks apart from the base model's, by the adapter's name (as vLLM does), and
    a salted request's apart from other salts': the proxy reads a request's `model` (any name but the base
    model's is an adapter's, whichever id each replica gave it) and `cache_salt`, and looks the prompt up under
    those keys."""
    proxy = Proxy(["http://a", "http://b"], parse_policy("prefix-aware"), 16, model_name="base")
    prompt = list(range(100, 164))

    def root(**body) -> int:
        scored = proxy.read(json.dumps({"prompt": prompt} | body).encode())[1]
        assert scored.token_ids == prompt and scored.session is None
        return scored.root
    assert root(model="chat") == cache_root("chat")
    assert root(model="base") == root() == cache_root() == 0
    assert root(model="chat", cache_salt="tenant-1") == cache_root("chat", "tenant-1") != cache_root("chat")
    assert root(cache_salt="tenant-1") == cache_root("", "tenant-1") not in (0, cache_root("tenant-1"))
    assert root(cache_salt=7) == 0          # (not a salt: the replica refuses it)
    a, b = proxy.replicas
    a.held = set(prompt_block_hashes(prompt, 16))                                  # the base model's blocks
    b.held = set(prompt_block_hashes(prompt, 16, cache_root("chat")))             # the adapter's
    assert proxy.router.pick_among([a, b], prompt, 0.0, root=cache_root("chat")) is b
    assert proxy.router.pick_among([a, b], prompt, 0.0) is a


# -- adapters loaded and dropped while the server runs ($VLLM_ALLOW_RUNTIME_LORA_UPDATING) --------------------
def test_adapters_load_and_unload_while_serving_as_vllm_does(setup):
    """/v1/load_lora_adapter and /v1/unload_lora_adapter: an adapter loaded while the server runs answers as the
    engine does with it, one loaded in place takes its new weights, and vLLM's refusals come in its words."""
    from engine.entrypoints.openai.app import ServerOptions

    folder, modules = setup
    sql, chat = modules
    expected = reference(setup)
    engine = LLMEngine(folder, block_size=8, num_gpu_blocks=128, max_num_seqs=16, **LORA)
    with BackgroundServer(engine, MODEL, folder, options=ServerOptions(runtime_lora_updating=True)) as srv:
        def load(name, path, **extra):
            return httpx.post(f"{srv.url}/v1/load_lora_adapter",
                              json={"lora_name": name, "lora_path": path} | extra, timeout=60)

        def unload(name):
            return httpx.post(f"{srv.url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)

        assert complete(srv, "sql", PROMPTS[0]).status_code == 404
        answer = load("sql", sql.path)
        assert (answer.status_code, answer.text) == (200, "Success: LoRA adapter 'sql' added successfully.")
        assert [complete(srv, "sql", p).json()["choices"][0]["text"] for p in PROMPTS] == expected["sql"]
        assert [d["id"] for d in httpx.get(f"{srv.url}/v1/models").json()["data"]] == [MODEL, "sql"]
        again = load("sql", chat.path)
        assert again.status_code == 400 and again.json()["error"]["type"] == "InvalidUserInput"
        assert "has already been loaded" in again.json()["error"]["message"]
        # in place: the same name and id, the other adapter's weights
        assert load("sql", chat.path, load_inplace=True).status_code == 200
        assert [complete(srv, "sql", p).json()["choices"][0]["text"] for p in PROMPTS] == expected["chat"]
        assert engine.list_loras() == {1}
        assert load("chat", "").json()["error"]["message"] == "Both 'lora_name' and 'lora_path' must be provided."
        broken = load("broken", f"{folder}/gone")
        assert broken.status_code == 400 and "\n" not in broken.json()["error"]["message"]
        assert broken.json()["error"]["message"].startswith("Loading lora broken failed: ")
        answer = unload("sql")
        assert (answer.status_code, answer.text) == (200, "Success: LoRA adapter 'sql' removed successfully.")
        assert complete(srv, "sql", PROMPTS[0]).status_code == 404 and engine.list_loras() == set()
        gone = unload("sql")
        assert gone.status_code == 404 and gone.json()["error"]["message"] == "The lora adapter 'sql' cannot be found."
        # a new name: the next id, never one given before (the broken load took 2, as vLLM's counter does)
        assert load("chat", chat.path).status_code == 200
        assert srv.state.models.adapters["chat"].lora_int_id == 3 and engine.list_loras() == {3}
        assert [complete(srv, "chat", p).json()["choices"][0]["text"] for p in PROMPTS] == expected["chat"]
        assert unload("chat").status_code == 200 and engine.list_loras() == set()
        # at once: two new names take two ids; one name asked for twice is loaded once
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda job: load(*job), [("a", sql.path), ("b", chat.path), ("c", sql.path),
                                                              ("c", sql.path)]))
        assert [a.status_code for a in answers[:2]] == [200, 200]
        assert sorted(a.status_code for a in answers[2:]) == [200, 400]      # the second waits, finds it loaded
        assert sorted(lora.lora_int_id for lora in srv.state.models.adapters.values()) == [4, 5, 6]
        assert engine.list_loras() == {4, 5, 6}


def test_runtime_lora_updates_are_off_unless_asked(server, monkeypatch):
    # vLLM registers the routes only with $VLLM_ALLOW_RUNTIME_LORA_UPDATING at 1 or true
    from engine.entrypoints.openai.app import ServerOptions

    for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        assert httpx.post(server.url + path, json={"lora_name": "sql", "lora_path": "x"}).status_code == 404
    for value, allowed in (("1", True), ("True", True), ("0", False), ("", False)):
        monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", value)
        assert ServerOptions().runtime_lora_updating is allowed


@pytest.mark.parametrize("statuses,expected", [
    ((200, 200), 200),      # both took it: the first answer
    ((400, 400), 400),      # both refused (already loaded): the first refusal as the replica gave it
    ((200, 400), 502),      # one took it: a 502 naming the other
    ((200, None), 502),     # one is down: a 502 naming it
])
def test_the_fleets_proxy_sends_a_lora_update_to_every_replica(statuses, expected):
    import asyncio

    from starlette.requests import Request

    proxy = Proxy(["http://a", "http://b"], parse_policy("prefix-aware"), 16, model_name="base")
    hosts = dict(zip("ab", statuses))
    proxy.replicas[1].up = statuses[1] is not None

    def replica(request: httpx.Request) -> httpx.Response:
        status = hosts[request.url.host]
        if status == 200:
            return httpx.Response(200, text="Success: LoRA adapter 'chat' added successfully.")
        return httpx.Response(status, json={"error": {"message": "The lora adapter 'chat' has already been loaded."}})

    async def update(path: str) -> httpx.Response:
        proxy.client = httpx.AsyncClient(transport=httpx.MockTransport(replica))
        body = json.dumps({"lora_name": "chat", "lora_path": "/adapters/chat"}).encode()

        async def receive():
            return {"type": "http.request", "body": body, "more_body": False}

        scope = {"type": "http", "method": "POST", "path": path, "headers": [], "query_string": b""}
        return await proxy.update_loras(Request(scope, receive))

    answer = asyncio.run(update("/v1/load_lora_adapter"))
    assert answer.status_code == expected
    # the fleet serves it when any replica took it: a replica that missed it gets it when it comes back
    loaded = {"chat": {"lora_name": "chat", "lora_path": "/adapters/chat"}} if 200 in statuses else {}
    assert proxy.adapters == loaded
    if expected == 502:
        assert "replica 1" in json.loads(answer.body)["error"]["message"]
    if expected == 200:
        asyncio.run(update("/v1/unload_lora_adapter"))
        assert proxy.adapters == {} and proxy.unloaded == {"chat"}


def test_a_replica_coming_back_gets_the_fleets_adapters_before_any_request():
    """A replica the launcher restarts serves only its --lora-modules. The proxy marks it down at once
    (`restarted`, from the launcher's thread) and, when it answers again, loads the adapters loaded through the
    proxy (in place where it serves the name from another folder: its start's version) and unloads those
    unloaded through it, before it marks it up."""
    import asyncio

    proxy = Proxy(["http://a", "http://b"], parse_policy("prefix-aware"), 16, model_name="base", api_key="k")
    chat = {"lora_name": "chat", "lora_path": "/adapters/chat"}
    sql = {"lora_name": "sql", "lora_path": "/adapters/sql-v2"}
    docs = {"lora_name": "docs", "lora_path": "/adapters/docs"}
    proxy.adapters, proxy.unloaded = {"chat": chat, "sql": sql, "docs": docs}, {"old", "gone"}
    seen = []

    def replica(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, json.loads(request.content) if request.content else None,
                     request.headers.get("authorization")))
        if request.url.path == "/v1/models":
            listed = [{"id": "base", "root": "/model"}, {"id": "docs", "root": "/adapters/docs"},   # as loaded
                      {"id": "sql", "root": "/adapters/sql"}, {"id": "old", "root": "/adapters/old"}]
            return httpx.Response(200, json={"data": listed})
        return httpx.Response(200)
    b = proxy.replicas[1]
    b.held, b.next_event = {1, 2}, 40             # the old process's prefix cache

    async def restart() -> bool:
        proxy.client = httpx.AsyncClient(transport=httpx.MockTransport(replica))
        proxy.loop = asyncio.get_running_loop()
        await asyncio.to_thread(proxy.restarted, 1)
        await asyncio.sleep(0)
        down = not b.up
        await proxy._probe(b)
        return down
    assert asyncio.run(restart())
    assert b.up and b.down_marks == 1 and (b.held, b.next_event) == (set(), 0)
    assert seen == [("GET", "/health", None, None), ("GET", "/v1/models", None, "Bearer k"),
                    ("POST", "/v1/load_lora_adapter", chat, "Bearer k"),
                    ("POST", "/v1/load_lora_adapter", sql | {"load_inplace": True}, "Bearer k"),
                    ("POST", "/v1/unload_lora_adapter", {"lora_name": "old"}, "Bearer k")]


def test_a_request_naming_an_adapter_in_the_resolver_folder_loads_it(setup, tmp_path):
    """vLLM's filesystem resolver ($VLLM_LORA_RESOLVER_CACHE_DIR, with runtime updates allowed): a request whose
    `model` names a LoRA folder there for this base model loads it and runs with it, once however many ask."""
    from engine.entrypoints.openai.app import ServerOptions

    folder, modules = setup
    expected = reference(setup)
    engine = LLMEngine(folder, block_size=8, num_gpu_blocks=128, max_num_seqs=16, **LORA)
    base = hf_model(folder)
    cache = tmp_path / "adapters"
    save_adapter(cache / "sql", base, LLAMA_TARGETS, seed=1, base_model_name_or_path=engine.deployment.model)
    save_adapter(cache / "chat", base, ["q_proj", "v_proj", "down_proj"], r=4, alpha=8, seed=2,
                 base_model_name_or_path=engine.deployment.model)
    save_adapter(cache / "other", base, LLAMA_TARGETS, base_model_name_or_path="another/model")
    save_adapter(cache / "wide", base, LLAMA_TARGETS, r=64, base_model_name_or_path=engine.deployment.model)
    save_adapter(tmp_path / "elsewhere", base, LLAMA_TARGETS, base_model_name_or_path=engine.deployment.model)
    options = ServerOptions(runtime_lora_updating=True, lora_resolver_dir=str(cache))
    with BackgroundServer(engine, MODEL, folder, options=options) as srv:
        assert [complete(srv, "sql", p).json()["choices"][0]["text"] for p in PROMPTS] == expected["sql"]
        with ThreadPoolExecutor(4) as pool:        # at once: loaded once
            answers = list(pool.map(lambda p: complete(srv, "chat", p), PROMPTS))
        assert [a.json()["choices"][0]["text"] for a in answers] == expected["chat"]
        assert engine.list_loras() == {1, 2}
        assert [d["id"] for d in httpx.get(f"{srv.url}/v1/models").json()["data"]] == [MODEL, "sql", "chat"]
        for name in ("other", "../elsewhere", "gone"):      # another base model's, outside the folder, none
            assert complete(srv, name, PROMPTS[0]).json()["error"]["message"] == f"The model `{name}` does not exist."
        wide = complete(srv, "wide", PROMPTS[0])           # a rank above --max-lora-rank: found, not loadable
        assert wide.status_code == 400
        assert wide.json()["error"]["message"] == "LoRA adapter 'wide' was found but could not be loaded."
    # only with runtime updates allowed, as in vLLM; and the folder must be one
    engine = LLMEngine(folder, block_size=8, num_gpu_blocks=128, max_num_seqs=16, **LORA)
    with BackgroundServer(engine, MODEL, folder, options=ServerOptions(lora_resolver_dir=str(cache))) as srv:
        assert complete(srv, "sql", PROMPTS[0]).status_code == 404
    with pytest.raises(ValueError, match="VLLM_LORA_RESOLVER_CACHE_DIR must name a folder"):
        BackgroundServer(engine, MODEL, folder, options=ServerOptions(runtime_lora_updating=True,
                                                                      lora_resolver_dir=str(cache / "none")))


def test_requests_naming_one_new_adapter_at_once_load_it_once(tmp_path):
    # vLLM's lock per adapter name: a request resolving an adapter another is loading waits, then runs with it
    import asyncio
    from types import SimpleNamespace

    from engine.entrypoints.openai.app import ServerOptions, _resolved

    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "base_model_name_or_path": "base/model"}))
    loaded = []

    class SlowEngine:                     # a load that takes a while, as a step in progress makes it
        async def between_steps(self, call):
            await asyncio.sleep(0.05)
            return call()

    engine = SimpleNamespace(deployment=SimpleNamespace(model="base/model"), add_lora=loaded.append)
    state = SimpleNamespace(options=ServerOptions(runtime_lora_updating=True, lora_resolver_dir=str(tmp_path)),
                            engine=engine, models=ServedModels("served"), async_engine=SlowEngine())

    async def both():
        return await asyncio.gather(_resolved(state, "sql"), _resolved(state, "sql"), _resolved(state, "gone"))

    first, second, gone = asyncio.run(both())
    assert first is second and [lora.lora_name for lora in loaded] == ["sql"] and gone is None
    assert first.lora_int_id == 1 and first.lora_path == str((tmp_path / "sql").resolve())


def test_metrics_say_which_adapters_run_and_wait_as_vllm_does(server):
    # vllm:lora_requests_info (vLLM's, with --enable-lora): a LoRA-aware router reads its labels
    import time
    from types import SimpleNamespace

    from engine.entrypoints.openai.metrics import _lora_info

    page = httpx.get(f"{server.url}/metrics").text
    line = next(line for line in page.splitlines() if line.startswith("vllm:lora_requests_info{"))
    assert line.startswith('vllm:lora_requests_info{max_lora="2",waiting_lora_adapters="",running_lora_adapters=""} ')
    assert abs(float(line.rsplit(" ", 1)[1]) - time.time()) < 60
    names = {0: "", 1: "sql", 2: "chat", 3: "adapter-3"}
    groups = [SimpleNamespace(lora_id=i, lora_name=names[i]) for i in (2, 0, 1, 2)]
    sched = SimpleNamespace(running=groups, waiting=[SimpleNamespace(lora_id=3, lora_name=names[3])])
    labels = _lora_info(sched, 4)[2]
    assert labels.startswith('vllm:lora_requests_info{max_lora="4",waiting_lora_adapters="adapter-3",'
                             'running_lora_adapters="chat,sql"} ')
