"""Run the app with uvicorn: in the foreground (`planner serve`) or on a background thread (tests, benches)."""
from __future__ import annotations

import socket
import threading
import time

import uvicorn

from engine.entrypoints.openai.app import build_app


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def make_server(engine, model_name: str, folder: str, host: str, port: int,
                log_level: str = "warning") -> uvicorn.Server:
    app = build_app(engine, model_name, folder)
    # No graceful-shutdown timeout: on SIGINT/SIGTERM uvicorn stops accepting,
    # lets every request in flight finish, then the engine loop stops.
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            lifespan="on", timeout_keep_alive=30)
    return uvicorn.Server(config)


class BackgroundServer:
    """A real server on a loopback port, run on a thread; ``stop()`` drains it."""

    def __init__(self, engine, model_name: str = "model", folder: str = "", host: str = "127.0.0.1",
                 port: int | None = None, startup_timeout: float = 60.0) -> None:
        self.engine = engine
        self.host = host
        self.port = port or free_port(host)
        self.server = make_server(engine, model_name, folder, host, self.port)
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

    def stop(self, timeout: float = 60.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> "BackgroundServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
