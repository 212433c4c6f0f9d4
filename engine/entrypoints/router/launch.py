"""Start a live fleet: K replica server processes on loopback ports, and the proxy in front of them.

Each replica is `python -m engine.entrypoints.openai.replica` with its own
port and engine (its log in `<log_dir>/replica-<i>.log`); the proxy
(proxy.py) runs in this process. Stopping goes in the order that loses no
request: the proxy drains first (uvicorn on SIGTERM/SIGINT: no new requests,
those in flight finish on their replicas), then every replica gets SIGTERM
and drains too. A replica that dies while starting stops the whole fleet
with the last line of its log. One that dies later is told (its exit status
and the last line of its log) and started again on its port, up to
MAX_RESTARTS times, while the others serve (the proxy's health watcher passes
it over until it answers); when none is left the router stops and the command
fails, for a supervisor to restart the fleet.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn

from engine.core.routing import SESSION_HEADER, RouterPolicy
from engine.entrypoints.http_guard import GuardedH11Protocol
from engine.entrypoints.openai.server import free_port
from engine.entrypoints.router.proxy import MAX_BODY, Proxy, build_proxy_app


@dataclass
class ReplicaProcess:
    index: int
    url: str
    process: subprocess.Popen | None           # None until started
    log: Path
    command: list[str] | None = None       # what started it (and restarts it, on its port)
    restarts: int = 0

    def start(self) -> None:
        """Start (or start again) its process, the log appended to."""
        with self.log.open("a") as out:
            self.process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def last_line(self) -> str:
        return self.log_tail() or f"exit status {self.process.returncode}"

    def log_tail(self) -> str | None:
        """The log's last line that says something, if any."""
        lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()] \
            if self.log.exists() else []
        return lines[-1] if lines else None


def start_replicas(configs: list[dict], log_dir: Path | None = None, timeout: float = 300.0) -> list[ReplicaProcess]:
    """Start one replica per config (each given a free loopback port) and wait until all are healthy."""
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="planner-fleet-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    replicas = []
    for i, config in enumerate(configs):
        port = free_port()
        log = log_dir / f"replica-{i}.log"
        log.write_text("")
        replica = ReplicaProcess(i, f"http://127.0.0.1:{port}", None, log, [
            sys.executable, "-m", "engine.entrypoints.openai.replica",
            json.dumps({**config, "host": "127.0.0.1", "port": port})])
        replica.start()
        replicas.append(replica)
    try:
        _wait_ready(replicas, timeout)
    except BaseException:
        stop_replicas(replicas)
        raise
    return replicas


def _wait_ready(replicas: list[ReplicaProcess], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    waiting = list(replicas)
    while waiting:
        for r in list(waiting):
            if r.process.poll() is not None:
                raise RuntimeError(f"replica {r.index} exited while starting: {r.last_line()} (log: {r.log})")
            try:
                if httpx.get(r.url + "/health", timeout=2.0).status_code == 200:
                    waiting.remove(r)
            except httpx.HTTPError:
                pass
        if waiting and time.monotonic() > deadline:
            raise RuntimeError(f"replica {waiting[0].index} did not start within {timeout:.0f} s (log: "
                               f"{waiting[0].log})")
        time.sleep(0.2 if waiting else 0)


def stop_replicas(replicas: list[ReplicaProcess], timeout: float = 60.0) -> None:
    """SIGTERM to each (they drain), then a kill for any still running after `timeout`."""
    for r in replicas:
        if r.process.poll() is None:
            r.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for r in replicas:
        try:
            r.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            r.process.kill()
            r.process.wait()


def proxy_server(urls: list[str], policy: RouterPolicy, block_size: int, host: str, port: int,
                 tokenizer=None, log_level: str = "warning", max_body: int = MAX_BODY,
                 probes: dict | None = None, api_key: str | None = None,
                 model_name: str | None = None, session_key: str = SESSION_HEADER) -> uvicorn.Server:
    """The proxy's server; `probes`: its health watcher's settings (Proxy's probe_* arguments) if not its own;
    `api_key`: the replicas' --api-key, which the proxy sends only on its own requests to them;
    `model_name`: the base model's served name (any other `model` names an adapter); `session_key`: the header
    naming a request's session (`session` routing)."""
    proxy = Proxy(urls, policy, block_size, tokenizer, api_key=api_key, model_name=model_name,
                  session_key=session_key, **(probes or {}))
    config = uvicorn.Config(build_proxy_app(proxy, max_body), host=host, port=port, log_level=log_level,
                            access_log=False, lifespan="on", timeout_keep_alive=30, http=GuardedH11Protocol)
    return uvicorn.Server(config)


def _max_body(configs: list[dict]) -> int:
    """The replicas' --max-request-body-size, which the proxy applies before it holds a body."""
    return configs[0].get("options", {}).get("max_request_body_size", MAX_BODY)


def _api_key(configs: list[dict]) -> str | None:
    return configs[0].get("options", {}).get("api_key")


def serve_fleet(configs: list[dict], policy: RouterPolicy, block_size: int, host: str, port: int, *,
                tokenizer=None, log_dir: Path | None = None, log_level: str = "warning", say=print,
                probes: dict | None = None, session_key: str = SESSION_HEADER) -> None:
    """`planner serve --replicas K`: the replicas, then the proxy in the foreground until SIGTERM/SIGINT."""
    replicas = start_replicas(configs, log_dir)
    # uvicorn drains on SIGTERM/SIGINT, restores the handlers it found and raises the signal again: this
    # handler turns that into an exception, so the replicas are stopped (drained) before the process ends.
    previous = signal.signal(signal.SIGTERM, _stopped)
    watch = None
    try:
        say(f"{len(replicas)} replicas ready: " + ", ".join(r.url for r in replicas) +
            f" (logs in {replicas[0].log.parent})")
        say(f"router ({policy.name}) on http://{host}:{port}/v1")
        server = proxy_server([r.url for r in replicas], policy, block_size, host, port, tokenizer, log_level,
                              _max_body(configs), probes, _api_key(configs), configs[0]["model_name"], session_key)
        watch = ExitWatch(replicas, server, say, server.config.app.state.proxy.restarted)
        watch.start()
        server.run()
    except (Stopped, KeyboardInterrupt):
        pass
    finally:
        stop_replicas(replicas)
        signal.signal(signal.SIGTERM, previous)
        if watch is None or not watch.all_exited:
            say("fleet stopped: the router and every replica drained")
    if watch is not None and watch.all_exited:
        raise RuntimeError(f"every replica exited, so the router stopped (logs in {replicas[0].log.parent})")


MAX_RESTARTS = 3      # times a replica that exits is started again on its port (a crash loop stops there)


class ExitWatch(threading.Thread):
    """Tells when a replica process exits after the fleet started (its status and its log's last line) and starts
    it again on its port, up to `restarts` times, calling `restarted(index)` (the proxy marks it down then, and
    up once it answers, with the fleet's adapters restored); when every replica has exited for good, stops the
    proxy (nothing is left to serve)."""

    def __init__(self, replicas: list[ReplicaProcess], server: uvicorn.Server, say, restarted=None,
                 period: float = 1.0, restarts: int = MAX_RESTARTS) -> None:
        super().__init__(name="fleet-exits", daemon=True)
        self.replicas, self.server, self.say, self.period, self.restarts = replicas, server, say, period, restarts
        self.restarted = restarted or (lambda index: None)
        self.exited: set[int] = set()          # replicas gone for good

    @property
    def all_exited(self) -> bool:
        return len(self.exited) == len(self.replicas)

    def run(self) -> None:
        while not self.server.should_exit:        # set on SIGTERM: the replicas are then stopped on purpose
            for r in self.replicas:
                code = r.process.poll()
                if code is None or r.index in self.exited:
                    continue
                how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
                tail = r.log_tail()
                said = f"replica {r.index} exited ({how}){': ' + tail if tail else ''} (log: {r.log})"
                if r.command is not None and r.restarts < self.restarts:
                    r.restarts += 1
                    self.say(f"{said}; starting it again ({r.restarts} of {self.restarts})")
                    self.restarted(r.index)
                    r.start()
                else:
                    self.exited.add(r.index)
                    self.say(said)
            if self.all_exited:
                self.server.should_exit = True
                return
            time.sleep(self.period)


class Stopped(Exception):
    """SIGTERM, once the proxy has drained."""


def _stopped(sig, frame) -> None:
    raise Stopped()


class BackgroundFleet:
    """A live fleet for tests and validation: the replicas, and the proxy on a thread; `stop()` drains all."""

    def __init__(self, configs: list[dict], policy: RouterPolicy, block_size: int, *, tokenizer=None,
                 log_dir: Path | None = None) -> None:
        self.replicas = start_replicas(configs, log_dir)
        self.port = free_port()
        self.server = proxy_server([r.url for r in self.replicas], policy, block_size, "127.0.0.1", self.port,
                                   tokenizer, max_body=_max_body(configs), api_key=_api_key(configs),
                                   model_name=configs[0].get("model_name"))
        self.thread = threading.Thread(target=self.server.run, name="fleet-proxy", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the fleet's proxy did not start")
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def proxy(self) -> Proxy:
        return self.server.config.app.state.proxy

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(60)
        stop_replicas(self.replicas)

    def __enter__(self) -> BackgroundFleet:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def server_threads(device: str) -> int | None:
    """Torch threads of a lone server's engine: on a CPU, every core but one, which the HTTP frontend (and
    a load client on the same machine) keeps. An engine thread that the frontend takes the core from
    stalls the whole parallel region it is in: on two cores the served steps took as long with two
    threads as with one, 13% longer than the same steps with nothing else running (docs/calibration.md)."""
    if device == "cuda":
        return None
    return max(1, (os.cpu_count() or 1) - 1)


def replica_threads(replicas: int, device: str) -> int | None:
    """Torch threads per replica: on a CPU, the cores shared out (else every replica would use them all)."""
    if device == "cuda":
        return None
    return max(1, (os.cpu_count() or 1) // replicas)
