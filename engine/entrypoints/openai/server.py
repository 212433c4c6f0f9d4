"""Run the app with uvicorn: in the foreground (`planner serve`) or on a background thread (tests, benches)."""
from __future__ import annotations

import ipaddress
import logging
import os
import socket
import threading
import time

import uvicorn

from engine.entrypoints.http_guard import GuardedH11Protocol
from engine.entrypoints.openai.app import ServerOptions, build_app
from engine.entrypoints.openai.served_models import LoRAModulePath

log = logging.getLogger("engine.entrypoints.openai")

API_KEY_ENV = "VLLM_API_KEY"    # vLLM's: the API key when --api-key is not given


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def resolve_api_key(given: str | None) -> str | None:
    """--api-key, else $VLLM_API_KEY, as vLLM takes it; an empty value means none."""
    return given or os.environ.get(API_KEY_ENV) or None


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """A warning when the server listens beyond this machine and asks no API key."""
    if api_key:
        return None
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:   # a host name: it may resolve to anything
        loopback = False
    if loopback:
        return None
    return (f"warning: serving on {host} without an API key: anyone who can reach this port can use the "
            f"model; give --api-key (or ${API_KEY_ENV}), or listen on 127.0.0.1")


def make_server(engine, model_name: str, host: str, port: int, log_level: str = "warning",
                options: ServerOptions | None = None, tokenizer_folder: str | None = None,
                lora_modules: list[LoRAModulePath] | None = None) -> uvicorn.Server:
    """The uvicorn server of the app; `lora_modules` are loaded now (a ValueError for a bad one)."""
    options = options or ServerOptions()
    app = build_app(engine, model_name, options, tokenizer_folder, lora_modules)
    # No graceful-shutdown timeout: on SIGINT/SIGTERM uvicorn stops accepting,
    # lets every request in flight finish, then the engine loop stops.
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            lifespan="on", timeout_keep_alive=options.timeout_keep_alive,
                            limit_concurrency=options.limit_concurrency, http=GuardedH11Protocol)
    return uvicorn.Server(config)


class BackgroundServer:
    """A real server on a loopback port, run on a thread; ``stop()`` drains it. ``folder``: where the
    server's tokenizer is loaded from (default: the engine's tokenizer's folder); ``lora_modules``: the LoRA
    adapters served beside the model (vLLM's --lora-modules)."""

    def __init__(self, engine, model_name: str = "model", folder: str | None = None, host: str = "127.0.0.1",
                 port: int | None = None, startup_timeout: float = 60.0, options: ServerOptions | None = None,
                 lora_modules: list[LoRAModulePath] | None = None) -> None:
        self.engine = engine
        self.host = host
        self.port = port or free_port(host)
        self.server = make_server(engine, model_name, host, self.port, options=options, tokenizer_folder=folder,
                                  lora_modules=lora_modules)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + startup_timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {self.host}:{self.port}")
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def app(self):
        return self.server.config.app

    @property
    def state(self):
        """The app's ServerState (its engine loop, frontend and statistics)."""
        return self.server.config.app.state.server

    def stop(self, timeout: float = 60.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> "BackgroundServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
