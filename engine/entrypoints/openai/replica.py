"""One replica of a live fleet: an OpenAI-compatible server in its own process.

`python -m engine.entrypoints.openai.replica CONFIG_JSON`, started by the
fleet launcher (engine/entrypoints/router/launch.py) with the deployment the
`planner serve` command resolved, so every replica runs exactly the engine a
lone `planner serve` runs. It exits when its parent goes away (the launcher
killed without its chance to stop it), so no replica outlives its fleet.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import torch

from engine.deployment import Deployment
from engine.entrypoints.openai.app import ServerOptions
from engine.entrypoints.openai.served_models import LoRAModulePath
from engine.entrypoints.openai.server import make_server
from engine.llm_engine import LLMEngine


def main(config: dict) -> None:
    if config.get("threads"):
        # K replicas on one CPU: each gets its share of the cores instead of all of them each.
        torch.set_num_threads(config["threads"])
    _exit_with_parent(os.getppid())
    deployment = Deployment.of(**config["deployment"])
    engine = LLMEngine(config["folder"], deployment, device=config.get("device", "auto"), seed=config.get("seed", 0))
    options = ServerOptions(**config.get("options", {}))
    lora_modules = [LoRAModulePath(**module) for module in config.get("lora_modules", [])]
    try:
        server = make_server(engine, config["model_name"], config.get("host", "127.0.0.1"), config["port"],
                             config.get("log_level", "warning"), options, config["folder"], lora_modules)
    except ValueError as exc:      # an adapter the engine cannot serve: the log's last line, which the launcher
        print(' '.join(str(exc).split()), file=sys.stderr, flush=True)      # reports as the reason
        sys.exit(1)
    server.run()


def _exit_with_parent(parent: int) -> None:
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)            # drain as on any SIGTERM
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
