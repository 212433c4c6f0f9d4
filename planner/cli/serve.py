"""`planner serve` (an OpenAI-compatible server over the engine) and `planner bench` (a trace-replay load client)."""
from __future__ import annotations

import json
import math
import os
import re
import socket
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table
from tqdm import tqdm
from uvicorn.config import LOG_LEVELS as UVICORN_LOG_LEVELS

from engine.core.metrics import LATENCY_STATISTICS
from engine.core.routing import SESSION_HEADER
from engine.deployment import Deployment
from planner.bench.client import BenchConfig, bench_metrics, run_bench, write_requests_csv
from planner.cli.options import (BURSTINESS, DEPLOYMENT_FLAGS, PARAM, RAMP_UP_END, RAMP_UP_START, RAMP_UP_STRATEGY,
                                 DeploymentChoices, check_live_replicas, deployment_options, ramp_up_of)
from planner.cli.output import check_writable, fail
from planner.deploy import checks
from planner.documents import json_safe
from planner.errors import PlannerError
from planner.profile.checkpoints import model_folder
from planner.runs.slos import parse_slos
from planner.runs.spec import check_ramp_up_rate
from planner.runs.trace_warnings import turns_warnings
from planner.sim.memory_guard import check_trace_size
from planner.sim.router import parse_router
from workloads import RampUp, TraceError, burstiness_arrival, make_trace, parse_workload_params
from workloads.clients import ClientKnobs

LOG_LEVELS = tuple(UVICORN_LOG_LEVELS)
HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")     # RFC 9110's token
FLEET_REPLICAS = typer.Option(None, "--replicas", metavar="K",
                              help="a live fleet: K engine servers on loopback ports (each its own process and "
                                   "engine) behind a routing proxy on --port")
FLEET_ROUTER = typer.Option(None, "--router", metavar="POLICY",
                            help="with --replicas: the proxy's policy, as simulate's (round-robin, least-requests, "
                                 "least-kv, prefix-aware, session, weighted:...)")
SESSION_KEY = typer.Option(None, "--session-key", metavar="HEADER",
                           help=f"with --router session: the request header naming a request's session "
                                f"(default {SESSION_HEADER}; the vLLM production stack's --session-key)")
BENCH_SESSION_KEY = typer.Option(None, "--session-key", metavar="HEADER",
                                 help="send each request's conversation id in this header (a fleet's session "
                                      "routing reads it)")
# The proxy's health watcher (docs/fleets.md, Live fleet): unset, the proxy's defaults.
PROBE_INTERVAL = typer.Option(None, "--probe-interval", metavar="SECONDS",
                              help="with --replicas: seconds between health probes of a replica (default 2)")
PROBE_TIMEOUT = typer.Option(None, "--probe-timeout", metavar="SECONDS",
                             help="with --replicas: seconds a health probe waits for the answer (default 5)")
PROBE_MISSES = typer.Option(None, "--probe-misses", metavar="N",
                            help="with --replicas: health probes in a row without an answer that mark a replica "
                                 "down (default 2)")
# vLLM's --lora-modules takes one or more values (argparse's nargs="+"); a typer option takes one, so the values
# after the first arrive as the command's words (MORE_VALUES), put back after it by many_valued().
SERVE_LORA_MODULES = typer.Option(None, "--lora-modules", metavar="NAME=PATH ...",
                                  help="with --enable-lora: the LoRA adapters served (vLLM's flag), each NAME=PATH (a "
                                       "PEFT folder) or a JSON object {\"name\": ..., \"path\": ...}; adapter i of "
                                       "the list gets lora_int_id i, a request whose `model` is NAME runs with it, "
                                       "and /v1/models lists it with the base model as its parent")
MORE_VALUES = typer.Argument(None, hidden=True, metavar="--lora-modules VALUE")
BENCH_LORA_MODULES = typer.Option(None, "--lora-modules", metavar="NAME ...",
                                  help="LoRA adapters to send as each request's `model` (vLLM bench's flag). A trace "
                                       "whose requests carry adapters (their `lora`, e.g. a workload's -p loras=N) "
                                       "sends adapter k under the k-th NAME and lora 0 under the base model; a trace "
                                       "without any sends every request under one NAME, chosen by --lora-assignment")
BENCH_LORA_ASSIGNMENT = typer.Option(None, "--lora-assignment", metavar="random|round-robin",
                                     help="for a trace without adapters of its own: random (the default, as vLLM "
                                          "bench: random.choice per request, seeded by --seed) or round-robin (in "
                                          "turn). A trace whose requests carry adapters keeps them (a workload "
                                          "draws them by -p lora_assignment=...)")


@deployment_options
def serve(
    deployments: DeploymentChoices,
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8000, min=1, max=65535, help="port to listen on"),
    served_model_name: Optional[str] = typer.Option(None, help="the name clients send as `model` "
                                                               "(default: the --model value)"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    seed: int = typer.Option(0, help="seed of requests that bring none"),
    log_level: str = typer.Option("warning", help=f"uvicorn's log level: {', '.join(LOG_LEVELS)}"),
    api_key: Optional[str] = typer.Option(None, help="require 'Authorization: Bearer KEY' on /v1/* "
                                                      "(default: $VLLM_API_KEY, as vLLM)"),
    max_request_body_size: int = typer.Option(16 << 20, help="largest request body in bytes (413 above)"),
    trust_request_chat_template: bool = typer.Option(False, "--trust-request-chat-template",
                                                     help="run a chat_template sent in a request (vLLM's flag)"),
    chat_template_timeout: float = typer.Option(2.0, help="seconds a chat template may take to render"),
    timeout_keep_alive: float = typer.Option(30.0, help="uvicorn: close an idle keep-alive connection after "
                                                       "this many seconds"),
    limit_concurrency: Optional[int] = typer.Option(None, help="uvicorn: connections and tasks at once before "
                                                               "it answers 503 (default: no limit)"),
    enable_prompt_tokens_details: bool = typer.Option(False, "--enable-prompt-tokens-details",
                                                      help="answer usage.prompt_tokens_details.cached_tokens "
                                                           "(vLLM's flag)"),
    replicas: Optional[int] = FLEET_REPLICAS, router: Optional[str] = FLEET_ROUTER,
    session_key: Optional[str] = SESSION_KEY,
    probe_interval: Optional[float] = PROBE_INTERVAL, probe_timeout: Optional[float] = PROBE_TIMEOUT,
    probe_misses: Optional[int] = PROBE_MISSES,
    lora_modules: Optional[list[str]] = SERVE_LORA_MODULES, more_values: Optional[list[str]] = MORE_VALUES,
) -> None:
    """Serve a model over the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models, /metrics):
    --model a local model folder, or a catalog model (random weights, byte-level tokenizer). With
    --replicas K, K servers behind a router (docs/fleets.md, Live fleet). With --enable-lora and
    --lora-modules, LoRA adapters beside the model; with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1, vLLM's
    /v1/load_lora_adapter and /v1/unload_lora_adapter and its VLLM_LORA_RESOLVER_CACHE_DIR (docs/lora.md)."""
    from engine.entrypoints.openai.app import ServerOptions       # torch: only a server needs it
    from engine.entrypoints.openai.served_models import ServedModels, parse_lora_modules   # torch (engine.lora)
    from engine.entrypoints.openai.server import exposure_warning, make_server, resolve_api_key   # torch
    import torch

    from engine.entrypoints.router.launch import server_threads   # torch (the server module)
    from engine.llm_engine import LLMEngine                       # torch
    from engine.models.loader import resolve_device               # torch
    try:
        options = _server_options(ServerOptions, resolve_api_key(api_key), max_request_body_size,
                                  trust_request_chat_template, chat_template_timeout, timeout_keep_alive,
                                  limit_concurrency, enable_prompt_tokens_details)
        if "model" not in deployments.given:
            raise PlannerError("give --model: a local model folder, or a catalog model")
        deployment = deployments.one("serve", model=deployments.values("model")[0])
        for flag, size, what in (("--tp", deployment.tp, "tensor"), ("--pp", deployment.pp, "pipeline")):
            if size != 1:
                raise PlannerError(f"{flag} {size} is not supported: this engine runs a model on one device "
                                   f"(use {flag} 1; `planner simulate {flag} {size}` models {what} parallelism)")
        knobs = ("client_turnaround", *(f.name for f in fields(ClientKnobs)))
        flag = next((DEPLOYMENT_FLAGS[name][0][0].split("/")[0] for name in knobs
                     if getattr(deployment, name) != getattr(Deployment, name)), None)
        if flag is not None:
            raise PlannerError(f"{flag} describes a run's clients (simulate, capacity, search, validate, "
                               f"bench); a server's clients are whoever connects to it")
        name = served_model_name or deployment.model
        modules = parse_lora_modules(many_valued("--lora-modules", lora_modules, more_values))
        if modules and not deployment.enable_lora:
            raise PlannerError("--lora-modules serves LoRA adapters: give --enable-lora too (as vLLM requires)")
        ServedModels(name, modules)             # the names checked (each once, none the model's) before any load
        checks.model(deployment.model)           # an unknown name fails here, before anything loads
        checks.gpu(deployment.gpu)               # and an unknown GPU (what /metrics and a profile name)
        resolve_device(device)                   # one this machine has, before anything loads
        check_listen(host, port)                 # an address this machine can listen on, before anything loads
        if log_level not in LOG_LEVELS:
            raise PlannerError(f"--log-level {log_level!r}: choose one of {', '.join(LOG_LEVELS)}")
        policy = fleet_policy(replicas, router, deployment)
        probes = fleet_probes(replicas, probe_interval, probe_timeout, probe_misses)
        session_key = fleet_session_key(policy, session_key)
        if replicas is not None:
            return _serve_fleet(deployment, replicas, policy, options, name, host, port, device,
                                seed, log_level, probes, modules, session_key)
        typer.echo(f"loading {deployment.model} ...", err=True)
        started = time.perf_counter()
        folder, _ = model_folder(deployment.model)
        threads = server_threads(device)
        if threads is not None:
            torch.set_num_threads(threads)
        engine = LLMEngine(folder, deployment, device=device, seed=seed)
        # loads the adapters: one the engine cannot serve is its ValueError, in one line
        server = make_server(engine, name, host, port, log_level, options, folder, modules)
    except (PlannerError, ValueError, OSError) as exc:
        raise fail(exc) from None
    cores = (f"; torch on {torch.get_num_threads()} of {os.cpu_count()} cores"
             if engine.runner.device.type == "cpu" else "")
    adapters = f"; LoRA adapters {', '.join(m.name for m in modules)}" if modules else ""
    typer.echo(f"serving {name} on http://{host}:{port}/v1 ({engine.runner.num_gpu_blocks} KV blocks of "
               f"{deployment.block_size}, max_model_len {engine.max_model_len}, {deployment.policy} policy{cores}"
               f"{adapters}; ready in {time.perf_counter() - started:.1f} s)", err=True)
    warning = exposure_warning(host, options.api_key)
    if warning:
        typer.echo(warning, err=True)
    server.run()


def many_valued(flag: str, given: Optional[list[str]], more: Optional[list[str]]) -> list[str]:
    """The values of a flag vLLM takes with nargs="+" (`--lora-modules a b c`): typer gave the flag its first
    value and left the rest as the command's words, which this command has none of otherwise. Repeating the
    flag (`--lora-modules a --lora-modules b`) works too; both at once would lose the order, so it is refused."""
    given, more = list(given or []), list(more or [])
    if more and not given:
        raise PlannerError(f"unexpected argument(s): {' '.join(more)}")
    if more and len(given) > 1:
        raise PlannerError(f"give every value after one {flag} (as vLLM takes them), or {flag} before each "
                           f"value; not both")
    return given + more


def check_listen(host: str, port: int) -> None:
    """Refuse, in one line, an address the server could not listen on (a host no resolver knows, a port in
    use): uvicorn would say so only after the model has loaded, and in a log line of its own."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as listener:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)    # as uvicorn binds it
            listener.bind(address)
    except OSError as exc:
        raise PlannerError(f"cannot listen on --host {host} --port {port}: {exc.strerror or exc}") from None


def fleet_policy(replicas: Optional[int], router: Optional[str], deployment):
    """The proxy's routing policy, checked (None without --replicas)."""
    if replicas is None:
        if router is not None:
            raise PlannerError("--router routes between replicas: give --replicas K too")
        return None
    check_live_replicas(replicas)
    policy = parse_router(router)
    if policy.uses_prefix and not deployment.prefix_caching_on:
        raise PlannerError("the prefix-aware router scores prefix-cache hits: give --enable-prefix-caching")
    return policy


def fleet_session_key(policy, header: Optional[str]) -> str:
    """The header `session` routing reads, checked: given only to a fleet whose policy uses it, and a header
    name HTTP allows."""
    if header is None:
        return SESSION_HEADER
    if policy is None or not policy.uses("session"):
        raise PlannerError("--session-key names the header session routing reads: give --replicas K and "
                           "--router session (or a weighted mix with session)")
    check_header_name("--session-key", header)
    return header.lower()


def check_header_name(flag: str, header: str) -> None:
    if not HEADER_NAME.fullmatch(header):
        raise PlannerError(f"{flag} {header!r} is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~)")


def fleet_probes(replicas: Optional[int], interval: Optional[float], timeout: Optional[float],
                 misses: Optional[int]) -> dict:
    """The health watcher's settings given (the proxy's keyword arguments), checked: one line for a bad one."""
    given = {"probe_period": ("--probe-interval", interval), "probe_timeout": ("--probe-timeout", timeout),
             "probe_failures": ("--probe-misses", misses)}
    probes = {}
    for key, (flag, value) in given.items():
        if value is None:
            continue
        if replicas is None:
            raise PlannerError(f"{flag} sets the fleet proxy's health checks: give --replicas K too")
        if not (value > 0 and math.isfinite(value)):     # nan and inf too: a probe must end and come again
            raise PlannerError(f"{flag} must be positive, got {value}")
        probes[key] = value
    return probes


def _serve_fleet(deployment, replicas: int, policy, options, name, host, port, device, seed,
                 log_level, probes: dict, lora_modules: list, session_key: str) -> None:
    """K replica processes of this deployment behind the routing proxy, in the foreground until SIGTERM. Each
    replica loads the same LoRA adapters (ids in the same order); one it cannot serve stops the fleet's start
    with the replica's one-line reason."""
    from dataclasses import asdict

    from engine.entrypoints.openai.server import exposure_warning               # torch: only a server needs it
    from engine.entrypoints.router.launch import replica_threads, serve_fleet   # torch (the server module)
    folder, _ = model_folder(deployment.model)
    config = {"folder": str(folder), "deployment": deployment.changed(), "device": device, "seed": seed,
              "model_name": name, "options": asdict(options), "log_level": log_level,
              "threads": replica_threads(replicas, device),
              "lora_modules": [asdict(module) for module in lora_modules]}
    tokenizer = None
    if policy.uses_prefix:                     # prefix scoring of text prompts needs the replicas' tokenizer
        from engine.llm_engine import load_tokenizer    # torch
        tokenizer = load_tokenizer(folder)
    warning = exposure_warning(host, options.api_key)
    if warning:
        typer.echo(warning, err=True)
    typer.echo(f"starting {replicas} replicas of {deployment.model} ...", err=True)
    try:
        serve_fleet([config] * replicas, policy, deployment.block_size, host, port, tokenizer=tokenizer,
                    log_level=log_level, say=lambda text: typer.echo(text, err=True), probes=probes,
                    session_key=session_key)
    except RuntimeError as exc:
        raise fail(exc) from None


def _server_options(options_type, api_key, max_body, trust_template, template_timeout, keep_alive, concurrency,
                    prompt_tokens_details):
    """The server's own settings, checked: one line for a bad value."""
    if max_body < 1:
        raise PlannerError(f"--max-request-body-size must be at least 1 byte, got {max_body}")
    if not template_timeout > 0:
        raise PlannerError(f"--chat-template-timeout must be positive, got {template_timeout}")
    if not keep_alive > 0:
        raise PlannerError(f"--timeout-keep-alive must be positive, got {keep_alive}")
    if concurrency is not None and concurrency < 1:
        raise PlannerError(f"--limit-concurrency must be at least 1, got {concurrency}")
    return options_type(api_key=api_key, max_request_body_size=max_body, trust_request_chat_template=trust_template,
                        chat_template_timeout=template_timeout, timeout_keep_alive=keep_alive,
                        limit_concurrency=concurrency, enable_prompt_tokens_details=prompt_tokens_details)


def bench(
    endpoint: str = typer.Option(..., help="server base URL, e.g. http://127.0.0.1:8000"),
    workload: Optional[str] = typer.Option(None, help="built-in workload to generate"),
    trace: Optional[str] = typer.Option(None, help="trace file (.jsonl/.csv) to replay with its own arrival times"),
    param: Optional[list[str]] = PARAM,
    model: Optional[str] = typer.Option(None, help="model name to send (default: the first of /v1/models)"),
    rate: Optional[float] = typer.Option(None, "--rate", "--request-rate",
                                         help="request rate (req/s, Poisson; vLLM bench's --request-rate); default: "
                                              "the trace's own times, 2 req/s for a workload"),
    burstiness: float = BURSTINESS,
    ramp_up_strategy: Optional[str] = RAMP_UP_STRATEGY, ramp_up_start_rps: Optional[float] = RAMP_UP_START,
    ramp_up_end_rps: Optional[float] = RAMP_UP_END,
    requests: int = typer.Option(100, "--requests", "--num-prompts",
                                 help="number of requests (a trace file: at most this many; vLLM bench's "
                                      "--num-prompts)"),
    seed: int = typer.Option(0),
    length_scale: float = typer.Option(1.0, help="scale prompt and output lengths (CPU servers need short ones)"),
    max_prompt_len: Optional[int] = typer.Option(None, help="cap prompt lengths (after scaling)"),
    max_output_len: Optional[int] = typer.Option(None, help="cap output lengths (after scaling)"),
    slo: list[str] = typer.Option([], "--slo", help="normalized latency limit (s/token) or METRIC=SECONDS "
                                                    "(ttft_p99=2, tpot_mean=0.1, ...); gives goodput; repeatable"),
    ignore_eos: bool = typer.Option(True, "--ignore-eos/--no-ignore-eos",
                                    help="send ignore_eos so outputs have the trace's lengths (vLLM accepts it)"),
    vocab_size: int = typer.Option(256, help="prompt token ids are drawn below this"),
    timeout: float = typer.Option(600.0, help="per-request timeout (s)"),
    prompt_format: str = typer.Option("text", help="text (words, as vllm bench serve sends; every server "
                                                   "takes them) | tokens (the trace's token ids)"),
    endpoint_type: str = typer.Option("completions", help="completions | chat"),
    api_key: Optional[str] = typer.Option(None, help="sent as 'Authorization: Bearer KEY' "
                                                      "(default: $OPENAI_API_KEY, as vllm bench)"),
    max_concurrency: Optional[int] = typer.Option(None, "--max-concurrency",
                                                  help="at most N requests in flight (vllm bench serve's flag); "
                                                       "without --rate every request is due at once: a closed "
                                                       "loop of N clients"),
    max_active_conversations: Optional[int] = typer.Option(
        None, "--max-active-conversations", metavar="K",
        help="with --max-concurrency N over a trace of conversations: the clients keep K active in all, each "
             "K // N, sending their turns in rotation (vLLM's multi-turn benchmark) [default: one each]"),
    client_request_rate: Optional[float] = typer.Option(
        None, "--client-request-rate", metavar="R",
        help="with --max-concurrency: each client's own rate, a pause after each request of an exponential time "
             "of mean 1/R minus the request's duration (vLLM's multi-turn benchmark's --request-rate) [default: "
             "no pause]"),
    client_early_stop: bool = typer.Option(
        False, "--client-early-stop/--no-client-early-stop",
        help="with --max-concurrency: stop all clients once one stops (it found no conversation left to take, or "
             "sent --client-max-requests), the trace's other turns never sent (vLLM's multi-turn benchmark's "
             "default) [default: off]"),
    client_max_requests: Optional[int] = typer.Option(
        None, "--client-max-requests", metavar="M",
        help="with --max-concurrency: the most requests each client sends (vLLM's multi-turn benchmark's "
             "--max-num-requests over its clients) [default: no limit]"),
    client_warmup_step: bool = typer.Option(
        False, "--client-warmup-step/--no-client-warmup-step",
        help="with --max-concurrency: every conversation's first turn first, left out of the results, then the "
             "later turns (vLLM's multi-turn benchmark's --warmup-step) [default: off]"),
    conversation_sampling: str = typer.Option(
        "round_robin", "--conversation-sampling",
        help="with --max-concurrency over conversations: round_robin (each client's in rotation) | random (picked "
             "at random, vLLM's multi-turn benchmark's --conversation-sampling random) [default: round_robin]"),
    client_warmup_percent: float = typer.Option(
        0.0, "--client-warmup-percent", metavar="X",
        help="with --max-concurrency: leave the first X% of the answered requests, as sent, out of the results "
             "(vLLM's multi-turn benchmark's --warmup-percentages X%) [default: 0]"),
    turns_after_answers: bool = typer.Option(
        False, "--turns-after-answers/--no-turns-after-answers",
        help="without --max-concurrency, over conversations: send each later turn once the answer to the turn "
             "before it has ended, its think time after, not at its trace time; the turns after a failed one "
             "are never sent [default: off]"),
    out: Optional[Path] = typer.Option(None, help="run folder (default: reports/bench/<time>-<workload>)"),
    as_json: bool = typer.Option(False, "--json", help="print the metrics as one JSON document"),
    lora_modules: Optional[list[str]] = BENCH_LORA_MODULES, lora_assignment: Optional[str] = BENCH_LORA_ASSIGNMENT,
    session_key: Optional[str] = BENCH_SESSION_KEY, more_values: Optional[list[str]] = MORE_VALUES,
) -> None:
    """Replay a trace against an OpenAI-compatible server; writes requests.csv and result.json.
    Exits 1 when every request failed. LoRA adapters (vLLM bench's --lora-modules): a trace whose requests
    carry adapters (-p loras=N) sends adapter k under the k-th name given; one without any sends each request
    under one of the names, chosen by --lora-assignment."""
    try:
        ramp_up = ramp_up_of(ramp_up_strategy, ramp_up_start_rps, ramp_up_end_rps)
        check_ramp_up_rate(ramp_up, rate)
        if max_concurrency is not None and rate is None and ramp_up is None:
            rate = math.inf                 # vllm bench serve's default rate: every request due at once
        if out is not None:
            check_writable(out, folder=True)     # before the run whose results it holds
        bench_trace = load_bench_trace(workload, trace, rate, requests, seed, length_scale, max_prompt_len,
                                       max_output_len, burstiness, param, ramp_up)
        slos = parse_slos(slo) if slo else None
        if session_key is not None:
            check_header_name("--session-key", session_key)
        cfg = BenchConfig(endpoint, model, ignore_eos, vocab_size, seed, timeout, prompt_format=prompt_format,
                          endpoint_type=endpoint_type, api_key=api_key, max_concurrency=max_concurrency,
                          max_active_conversations=max_active_conversations, client_request_rate=client_request_rate,
                          client_early_stop=client_early_stop, client_max_requests=client_max_requests,
                          client_warmup_step=client_warmup_step, conversation_sampling=conversation_sampling,
                          client_warmup_percent=client_warmup_percent, turns_after_answers=turns_after_answers,
                          lora_modules=tuple(many_valued("--lora-modules", lora_modules, more_values)),
                          lora_assignment=lora_assignment, session_key=session_key)
        for line in turns_warnings(bench_trace, turns_after_answers, cfg.max_concurrency):
            typer.echo(f"warning: {line}", err=True)
        with tqdm(total=len(bench_trace), desc="requests", unit="req", file=sys.stderr,
                  disable=as_json or not sys.stderr.isatty()) as bar:
            results, wall = run_bench(bench_trace, cfg, progress=lambda: bar.update(1))
    except (PlannerError, TraceError, ValueError, OSError) as exc:
        raise fail(exc) from None
    name = Path(trace).stem if trace else workload
    _report_bench(results, wall, cfg, slos, out, as_json, workload=name, rate=rate, max_concurrency=max_concurrency,
                  seed=seed, length_scale=length_scale, burstiness=burstiness, ramp_up=ramp_up)


def _report_bench(results, wall: float, cfg: BenchConfig, slos, out: Optional[Path], as_json: bool, *,
                  workload: str, rate, max_concurrency, seed: int, length_scale: float, burstiness: float,
                  ramp_up: RampUp | None = None) -> None:
    """Bench's metrics (goodput with SLOs), requests.csv and result.json, and the summary; exit 1 when every
    request failed."""
    metrics = bench_metrics(results, slos)
    folder = out or Path("reports") / "bench" / f"{time.strftime('%Y%m%d-%H%M%S')}-{workload}"
    folder.mkdir(parents=True, exist_ok=True)
    write_requests_csv(results, folder / "requests.csv")
    failures = [{"request_id": r.request_id, "error": r.error} for r in results if not r.success]
    loras = {"lora_modules": list(cfg.lora_modules), "lora_assignment": cfg.lora_assignment} \
        if cfg.lora_modules else {}
    doc = json_safe({**metrics, "endpoint": cfg.endpoint, "model": cfg.model, **loras, "workload": workload,
                     "rate": rate, "burstiness": burstiness, **(ramp_up.record() if ramp_up else {}),
                     "max_concurrency": max_concurrency, **asdict(ClientKnobs.of(cfg)),
                     "seed": seed,
                     "length_scale": length_scale, "wall_time": wall, "failures": failures, "folder": str(folder)})
    (folder / "result.json").write_text(json.dumps(doc, indent=2) + "\n")
    if as_json:
        sys.stdout.write(json.dumps(doc) + "\n")
    else:
        print_bench_summary(doc, Console())
    if results and not any(r.success for r in results):
        typer.echo(f"error: every request failed ({len(results)}); the first: {failures[0]['error']}", err=True)
        raise typer.Exit(1)


def load_bench_trace(workload, trace, rate, requests, seed, length_scale, max_prompt_len, max_output_len,
                     burstiness: float = 1.0, param: list[str] | None = None, ramp_up: RampUp | None = None):
    """The trace a bench replays: a built-in workload (its -p KEY=VALUE parameters) or a trace file, its
    arrivals at the rate (or by the ramp-up) gamma-distributed with the burstiness's shape (1: Poisson)."""
    if (workload is None) == (trace is None):
        raise PlannerError("give exactly one of --workload and --trace")
    if requests < 1:
        raise PlannerError(f"--requests must be at least 1, got {requests}")
    if rate is not None and not rate > 0:
        raise PlannerError(f"--rate must be positive, got {rate}")
    check_trace_size(requests, None, 2.0 if rate is None else rate)
    rate = rate if rate is not None else math.inf if trace is not None or ramp_up is not None else 2.0
    params = parse_workload_params(trace or workload, param or [])
    t = make_trace(trace or workload, num_requests=requests, rate=rate, seed=seed, ramp_up=ramp_up, **params,
                   **burstiness_arrival(burstiness, ramp_up.start_rps if ramp_up else rate))
    if length_scale != 1.0 or max_prompt_len is not None or max_output_len is not None:
        t = t.scaled(length_scale=length_scale, max_prompt_len=max_prompt_len, max_output_len=max_output_len)
    return t


def print_bench_summary(doc: dict, console) -> None:
    table = Table(title=f"bench: {doc.get('workload')} against {doc.get('endpoint')}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [("completed / failed", f"{doc.get('num_completed')} / {doc.get('num_failed')}"),
            ("total input / generated tokens", f"{doc.get('total_input_tokens')} / {doc.get('total_output_tokens')}"),
            ("request throughput (req/s)", doc.get("request_throughput")),
            ("output token throughput (tok/s)", doc.get("output_token_throughput")),
            ("peak output token throughput (tok/s)", doc.get("max_output_tokens_per_s")),
            ("peak concurrent requests", doc.get("max_concurrent_requests"))]
    for m in ("ttft", "tpot", "itl", "e2e"):
        rows.append((f"{m.upper()} mean / median / p90 / p95 / p99 (s)",
                     " / ".join("–" if doc.get(f"{m}_{s}") is None else f"{doc[f'{m}_{s}']:.4f}"
                                for s in LATENCY_STATISTICS)))
    if "request_goodput" in doc:
        rows.append(("goodput (req/s)", doc["request_goodput"]))
    for k, v in rows:
        table.add_row(k, f"{v:.4g}" if isinstance(v, float) else str(v))
    console.print(table)
    for f in doc.get("failures", [])[:5]:
        console.print(f"failed {f['request_id']}: {f['error']}", highlight=False)
    console.print(f"run folder: {doc.get('folder')}", highlight=False)
