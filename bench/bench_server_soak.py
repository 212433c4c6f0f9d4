"""Soak of `planner serve`'s server (issue 27): load, abuse and injected failures at once, then SIGTERM.

For ``--seconds`` (two minutes): ``--streams`` (200) clients keep one streaming request each in flight
(a new one as soon as the last ends), ``--disconnects`` (50) of those requests are dropped mid-stream,
``--fuzz-rate`` (20) fuzzed bodies a second arrive (spoiled fields, NaN, huge numbers, lone surrogates,
non-JSON) from a process of their own, and every 5 s a request carries a prompt that makes the model runner
raise (an injected step failure: that step's requests, the others admitted with it included, get a 500
naming it). Then a last wave of streams is started and the server gets SIGTERM while they run.

It prints what came back and checks, each with its figure: every request sent accounted for, none lost
(an exception instead of an answer) or hung (open past its timeout), no 5xx but the injected ones, no 4xx
to a valid body, the server's /metrics agreeing with what the clients saw, /health 200 after the load,
every stream of the last wave ended with [DONE] after SIGTERM, and the server exiting cleanly (uvicorn
re-raises SIGTERM once it has shut down gracefully: exit status -15). The server is a tiny random-weight
model (tests/serve_helpers.py) in a subprocess, so SIGTERM reaches uvicorn as it would in production; the
clients' processes never load torch.

    .venv/bin/python bench/bench_server_soak.py [--seconds 120 --streams 200 --disconnects 50 --fuzz-rate 20]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import httpx  # noqa: E402

POISON = [5, 300, 7, 300, 5]   # a prompt only the injected-failure requests start with
INJECT_EVERY = 5.0    # seconds between injected failures
TIMEOUT = 120.0       # a request still open after this is hung
WORDS = "the of and to in is was for on are with as by at be this from or have an they which one".split()


@dataclass
class Tally:
    sent: int = 0                # requests sent (each must end in exactly one of the counts below)
    completed: int = 0           # streams and non-streaming requests served in full
    disconnected: int = 0        # dropped by their client mid-stream
    injected: int = 0            # ended by an injected step failure (500 or an error event naming it)
    poisoned: int = 0            # requests sent to make a step fail (the others in their steps fail too)
    other_5xx: list = field(default_factory=list)
    unexpected_4xx: list = field(default_factory=list)
    fuzz: dict = field(default_factory=lambda: {"2xx": 0, "4xx": 0, "sent": 0})
    lost: list = field(default_factory=list)      # an exception instead of an answer
    hung: int = 0


# -- the server (this file run with --serve) ---------------------------------------------------------
def serve(port: int) -> None:
    from engine.entrypoints.openai.server import make_server    # torch: only the server process loads it
    from engine.llm_engine import LLMEngine                      # torch
    from serve_helpers import save_byte_model                    # torch
    folder = save_byte_model(tempfile.mkdtemp(prefix="soak-model-"))
    engine = LLMEngine(folder, block_size=8, num_gpu_blocks=4096, max_num_seqs=256, max_model_len=128)
    execute = engine.runner.execute

    def execute_or_fail(inputs):
        if any(i.start_pos == 0 and i.token_ids[:len(POISON)] == POISON for i in inputs):
            raise RuntimeError("injected step failure")
        return execute(inputs)
    engine.runner.execute = execute_or_fail
    make_server(engine, "tiny", "127.0.0.1", port, tokenizer_folder=folder).run()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the server did not start: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.2)


# -- requests ----------------------------------------------------------------------------------------
def stream_body(rng: random.Random) -> dict:
    return {"prompt": " ".join(rng.choices(WORDS, k=rng.randint(2, 8))), "max_tokens": rng.randint(8, 32),
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


def fuzz_body(rng: random.Random) -> bytes:
    """A valid request with one field spoiled, or something that is not a request at all."""
    junk = [float("nan"), float("inf"), 1 << 64, -(1 << 70), -1, 0, 1e-40, 3.5, "\ud800", "", [], {}, None, True,
            [[1, [2]]], {"a": {"b": "\udfff"}}, "x" * 3000, [-5, 10 ** 20]]
    body = {"prompt": rng.choice(WORDS), "max_tokens": rng.randint(1, 6), "stream": rng.random() < 0.3}
    field_name = rng.choice(["prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "n", "best_of",
                             "stop", "logprobs", "stream", "model", "stop_token_ids", "messages", "unknown"])
    body[field_name] = rng.choice(junk)
    roll = rng.random()
    if roll < 0.1:
        return rng.randbytes(rng.randint(0, 64))
    if roll < 0.2:
        return b'{"prompt": "hi", "max_tokens": 2, "temperature": NaN}'
    return json.dumps(body).encode()


async def read_answer(response) -> tuple[int, list[str], str]:
    """(status, SSE data lines, body text when not a stream)."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        return response.status_code, [ln[6:] async for ln in response.aiter_lines() if ln.startswith("data: ")], ""
    return response.status_code, [], (await response.aread()).decode(errors="replace")


def classify(tally: Tally, status: int, events: list[str], text: str, *, fuzz: bool) -> bool:
    """Count one answered request; True when it was served in full."""
    message = text + "".join(e for e in events if '"error"' in e[:12])
    if "injected step failure" in message:
        tally.injected += 1
        return False
    if 400 <= status < 500:
        if fuzz:
            tally.fuzz["4xx"] += 1
        else:
            tally.unexpected_4xx.append((status, text[:200]))
        return False
    if status >= 500 or (events and events[-1] != "[DONE]") or '"error"' in message:
        tally.other_5xx.append((status, message[:200]))
        return False
    tally.fuzz["2xx"] += fuzz
    tally.completed += 1
    return True


async def one_request(client, tally: Tally, content: bytes, *, fuzz: bool, drop_after: int | None = None) -> bool:
    """Send one request and count how it ended; True when it was dropped mid-stream as asked."""
    tally.sent += 1
    try:
        async with asyncio.timeout(TIMEOUT):
            async with client.stream("POST", "/v1/completions", content=content,
                                     headers={"content-type": "application/json"}) as response:
                if drop_after is not None and response.status_code == 200:
                    async for _ in aiter_n(response.aiter_lines(), drop_after):
                        pass
                    tally.disconnected += 1
                    return True
                status, events, text = await read_answer(response)
        classify(tally, status, events, text, fuzz=fuzz)
    except TimeoutError:
        tally.hung += 1
    except (httpx.HTTPError, ValueError) as exc:
        kind = "fuzz" if fuzz else "stream" if drop_after is None else "dropped stream"
        tally.lost.append(f"{kind} {content[:80]!r}: {type(exc).__name__}: {exc}"[:300])
    return False


async def aiter_n(iterator, n: int):
    count = 0
    async for item in iterator:
        yield item
        count += 1
        if count >= n:
            return


# -- the load ------------------------------------------------------------------------------------------
async def load(url: str, args, tally: Tally) -> None:
    rng = random.Random(args.seed)
    end = time.monotonic() + args.seconds
    drops = [time.monotonic() + 0.9 * args.seconds * (i + 0.5) / args.disconnects for i in range(args.disconnects)]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=TIMEOUT) as client:
        async def streamer():
            while time.monotonic() < end:
                drop = drops.pop(0) if drops and time.monotonic() >= drops[0] else None
                dropped = await one_request(client, tally, json.dumps(stream_body(rng)).encode(), fuzz=False,
                                            drop_after=None if drop is None else 3)
                if drop is not None and not dropped:
                    drops.insert(0, drop)      # refused or failed before streaming: the next one drops

        async def injector():
            body = json.dumps({"prompt": POISON, "max_tokens": 4}).encode()
            while time.monotonic() < end:
                await asyncio.sleep(INJECT_EVERY)
                tally.poisoned += 1
                await one_request(client, tally, body, fuzz=False)

        await asyncio.gather(*(streamer() for _ in range(args.streams)), injector())


def fuzz_process(url: str, rate: float, seconds: float, seed: int, results) -> None:
    """Fuzzed bodies at ``rate`` a second for ``seconds``, on their own schedule and CPU (a process of
    their own, so the streams' client cannot slow them down); the tally goes back through ``results``."""
    tally = Tally()

    async def run():
        rng = random.Random(seed + 1)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=TIMEOUT) as client:
            start, tasks = time.monotonic(), []
            for i in range(int(rate * seconds)):
                await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
                tasks.append(asyncio.create_task(one_request(client, tally, fuzz_body(rng), fuzz=True)))
            await asyncio.gather(*tasks)
    asyncio.run(run())
    results.put(tally)


def merge(tally: Tally, fuzz: Tally) -> None:
    tally.sent += fuzz.sent
    tally.completed += fuzz.completed
    tally.injected += fuzz.injected
    tally.other_5xx += fuzz.other_5xx
    tally.fuzz = {**fuzz.fuzz, "sent": fuzz.sent}
    tally.lost += fuzz.lost
    tally.hung += fuzz.hung


def scrape(url: str) -> dict:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    out: dict = {"finished": {}, "4xx": 0.0}
    for line in text.splitlines():
        if line.startswith("vllm:request_success_total{"):
            reason = line.split('finished_reason="')[1].split('"')[0]
            out["finished"][reason] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("http_requests_total{") and 'status="4xx"' in line:
            out["4xx"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{")):
            out[line.split("{")[0]] = float(line.rsplit(" ", 1)[1])
    return out


def wait_idle(url: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(url)
        if m["vllm:num_requests_running"] + m["vllm:num_requests_waiting"] == 0 or time.monotonic() > deadline:
            return m
        time.sleep(0.2)


# -- SIGTERM with streams in flight ---------------------------------------------------------------------
async def last_wave(url: str, proc: subprocess.Popen, n: int) -> list[tuple[str, int]]:
    """n streams of 64 tokens; SIGTERM once each has its first token; what each ended with."""
    started = asyncio.Semaphore(0)

    async def one(client, i):
        body = {"prompt": f"drain {i}", "max_tokens": 64, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        events = []
        async with client.stream("POST", "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    if not events:
                        started.release()
                    events.append(line[6:])
        usage = json.loads(events[-2]).get("usage") or {}
        return events[-1], usage.get("completion_tokens", 0)

    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
        tasks = [asyncio.create_task(one(client, i)) for i in range(n)]
        for _ in range(n):
            await asyncio.wait_for(started.acquire(), TIMEOUT)
        proc.send_signal(signal.SIGTERM)
        return list(await asyncio.gather(*tasks, return_exceptions=True))


def report(args, tally: Tally, before: dict, after: dict, health: int, wave, exit_code, wall: float) -> bool:
    finished = {k: after["finished"].get(k, 0) - before["finished"].get(k, 0) for k in after["finished"]}
    served = finished.get("stop", 0) + finished.get("length", 0)
    ended = (tally.completed + tally.disconnected + tally.injected + len(tally.other_5xx) + len(tally.unexpected_4xx)
             + tally.fuzz["4xx"] + len(tally.lost) + tally.hung)
    checks = [
        ("every request sent is accounted for", ended == tally.sent, f"{ended} of {tally.sent}"),
        ("no request lost", len(tally.lost) == 0, f"{len(tally.lost)} {tally.lost[:3]}"),
        ("no request hung", tally.hung == 0, tally.hung),
        ("no 5xx but injected", not tally.other_5xx, f"{len(tally.other_5xx)} {tally.other_5xx[:3]}"),
        ("no 4xx to a valid body", not tally.unexpected_4xx, f"{len(tally.unexpected_4xx)}"),
        ("/metrics error == injected", finished.get("error", 0) == tally.injected,
         f"{finished.get('error', 0)} vs {tally.injected}"),
        ("/metrics stop+length+abort == served + dropped", served + finished.get("abort", 0)
         == tally.completed + tally.disconnected, f"{served}+{finished.get('abort', 0)} vs "
         f"{tally.completed}+{tally.disconnected}"),
        ("/metrics 4xx == fuzz 4xx", after["4xx"] - before["4xx"] == tally.fuzz["4xx"],
         f"{after['4xx'] - before['4xx']:.0f} vs {tally.fuzz['4xx']}"),
        ("/health 200 after the load", health == 200, health),
        ("SIGTERM: every stream ended with [DONE], 64 tokens", all(w == ("[DONE]", 64) for w in wave),
         f"{sum(w == ('[DONE]', 64) for w in wave)}/{len(wave)} {[w for w in wave if w != ('[DONE]', 64)][:2]}"),
        # uvicorn re-raises the signal once it has shut down gracefully: -15 is the clean exit.
        ("SIGTERM: the server exited cleanly", exit_code in (0, -signal.SIGTERM), exit_code),
    ]
    sent = tally.fuzz["sent"]
    print(f"soak: {args.seconds:.0f} s of load, {args.streams} concurrent streams, {sent} fuzzed bodies "
          f"({sent / args.seconds:.1f}/s), wall {wall:.0f} s")
    print(f"  served in full {tally.completed} (fuzz 2xx {tally.fuzz['2xx']}), dropped mid-stream "
          f"{tally.disconnected}, fuzz 4xx {tally.fuzz['4xx']}, ended by injected failures {tally.injected} "
          f"({tally.poisoned} failing requests sent, the rest shared their steps)")
    print(f"  /metrics finished by reason: {json.dumps({k: int(v) for k, v in sorted(finished.items())})}")
    for name, ok, figure in checks:
        print(f"  [{'ok' if ok else 'FAIL'}] {name}: {figure}")
    return all(ok for _, ok, _ in checks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--disconnects", type=int, default=50)
    parser.add_argument("--fuzz-rate", type=float, default=20.0)
    parser.add_argument("--last-wave", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(port)
    started = time.monotonic()
    try:
        before = scrape(url)
        tally = Tally()
        results = multiprocessing.get_context("spawn").Queue()
        fuzzer = multiprocessing.get_context("spawn").Process(
            target=fuzz_process, args=(url, args.fuzz_rate, args.seconds, args.seed, results))
        fuzzer.start()
        asyncio.run(load(url, args, tally))
        merge(tally, results.get(timeout=TIMEOUT + 60))
        fuzzer.join(30)
        after = wait_idle(url)
        health = httpx.get(f"{url}/health", timeout=30).status_code
        wave = asyncio.run(last_wave(url, proc, args.last_wave))
        exit_code = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
    ok = report(args, tally, before, after, health, wave, exit_code, time.monotonic() - started)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        serve(int(sys.argv[2]))
    else:
        main()
