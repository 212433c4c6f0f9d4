"""The options the commands share, declared once: every deployment setting, the load, the outputs.

`@deployment_options` gives a command one option per `Deployment` field
(vLLM's names: --block-size, --max-num-seqs, ...), each taking a value or a
comma list, and hands the command a `DeploymentChoices`: `one()` for the
commands that run one deployment, `product()` for a sweep or a search. A new
deployment field is a new flag of every such command with no other change.
"""
from __future__ import annotations

import functools
import inspect
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer

from engine.deployment import POLICIES, Deployment
from planner.cli.output import fail, split_values
from planner.errors import PlannerError
from workloads import RampUp

# Per field: the flags it answers to and its help (the value's type comes from the dataclass).
DEPLOYMENT_FLAGS: dict[str, tuple[tuple[str, ...], str]] = {
    "model": (("--model",), "a catalog model (planner list models), a Hugging Face id the catalog knows, or a "
                            "local model folder"),
    "gpu": (("--gpu", "--gpus"), "GPU from the catalog (planner list gpus), or cpu"),
    "tp": (("--tp", "--tensor-parallel-size"), "tensor parallel size"),
    "pp": (("--pp", "--pipeline-parallel-size"), "pipeline-parallel size: the layers in pp stages of tp GPUs "
                                                 "each, pp batches in flight (vllm-v1; not with --dp, --pd or "
                                                 "--speculative) [default: 1]"),
    "node_link": (("--node-link",), "the network between 8-GPU nodes, for a deployment over more than one: "
                                    "infiniband (NDR 400 Gb/s per GPU) or ethernet (100 GbE per GPU) "
                                    "[default: infiniband]"),
    "disable_custom_all_reduce": (("--disable-custom-all-reduce/--no-disable-custom-all-reduce",),
                                  "tensor parallelism: every all-reduce through NCCL, not vLLM's custom all-reduce "
                                  "kernel (the measured model prices NCCL's table) [default: off]"),
    "dp": (("--dp", "--data-parallel-size"), "data-parallel size: attention replicas inside one deployment, "
                                             "their MoE experts shared over tp x dp GPUs [default: 1]"),
    "enable_expert_parallel": (("--enable-expert-parallel/--no-enable-expert-parallel",),
                               "MoE: whole experts split over tp x dp GPUs (EP = TP x DP) instead of each "
                               "expert's width [default: off]"),
    "all2all_backend": (("--all2all-backend",), "MoE with --enable-expert-parallel and --dp > 1: how tokens reach "
                                                "their experts: allgather_reducescatter (vLLM's default, NCCL), "
                                                "deepep_low_latency or deepep_high_throughput (DeepEP) "
                                                "[default: allgather_reducescatter]"),
    "enable_eplb": (("--enable-eplb/--no-enable-eplb",), "MoE with --enable-expert-parallel: vLLM's expert-parallel "
                                                          "load balancer [default: off]"),
    "num_redundant_experts": (("--num-redundant-experts",), "with --enable-eplb: extra copies of the busiest experts "
                                                            "over the EP ranks (vLLM's --eplb-config "
                                                            "num_redundant_experts), each rank holding (E + R) / EP "
                                                            "[default: 0]"),
    "moe_backend": (("--moe-backend",), "MoE: the experts' kernel: auto (vLLM's choice: DeepGEMM behind DeepEP for "
                                        "block-FP8 experts), triton or deep_gemm [default: auto]"),
    "enable_dbo": (("--enable-dbo/--no-enable-dbo",), "MoE with a DeepEP --all2all-backend: vLLM's dual-batch "
                                                        "overlap, a large step run as two microbatches, one's "
                                                        "all-to-all under the other's compute [default: off]"),
    "dbo_decode_token_threshold": (("--dbo-decode-token-threshold",), "with --enable-dbo: the fewest tokens of a "
                                                                      "decode step it splits [default: 32]"),
    "dbo_prefill_token_threshold": (("--dbo-prefill-token-threshold",), "with --enable-dbo: the fewest tokens of "
                                                                        "a step with prompts it splits "
                                                                        "[default: 512]"),
    "moe_skew": (("--moe-skew",), "MoE routing skew: expert popularity ~ (rank + 1)^-S (0: uniform; NVIDIA "
                                  "measured 1.01 and 1.2) [default: 0]"),
    "dtype": (("--dtype",), "auto, float16, bfloat16 or float32"),
    "block_size": (("--block-size",), "KV block size in tokens [default: 16]"),
    "max_num_seqs": (("--max-num-seqs",), "most sequences per step [default: the policy's: vllm-v1 as vLLM's API "
                                          "server sets it per device (1024 on GPUs of 70 GiB or more but A100, 256 "
                                          "on others, 128 on the CPU); 256 for paper]"),
    "max_num_batched_tokens": (("--max-num-batched-tokens",), "most tokens per step [default: the policy's: "
                                                              "vllm-v1 as vLLM's API server sets it per device (8192 "
                                                              "on GPUs of 70 GiB or more but A100, else 2048); "
                                                              "max(max_model_len, 2048) for paper]"),
    "enable_chunked_prefill": (("--enable-chunked-prefill/--no-enable-chunked-prefill",
                                "--chunked-prefill/--no-chunked-prefill"),
                               "vllm-v1's chunked prefill: off, a waiting prompt larger than the budget left waits "
                               "for a step with room, and the default budget is raised to max_model_len, as vLLM "
                               "does [default: on for vllm-v1 (on alone it asks for that policy); the paper's "
                               "policy has none]"),
    "scheduling_policy": (("--scheduling-policy",), "vLLM's: fcfs, or priority (vllm-v1): waiting requests by their "
                                                    "priority (the lower value first; a trace's `priority` field), "
                                                    "then arrival, and the running request of the lowest priority "
                                                    "preempted first [default: fcfs]"),
    "long_prefill_token_threshold": (("--long-prefill-token-threshold",),
                                     "vllm-v1: the most tokens one request takes in a step, so a long prompt is "
                                     "prefilled in chunks of at most that many [default: 0, the budget's]"),
    "performance_mode": (("--performance-mode",), "vLLM's: balanced, interactivity (a CUDA graph for every "
                                                   "step of 1-32 tokens) or throughput (twice the default token "
                                                   "budget and --max-num-seqs) [default: balanced]"),
    "max_model_len": (("--max-model-len",), "longest sequence served [default: the model's own]"),
    "gpu_memory_utilization": (("--gpu-memory-utilization",), "fraction of GPU memory the engine may use "
                                                              "[default: 0.9]"),
    "swap_space": (("--swap-space",), "CPU swap space per GPU in GiB [default: 4]"),
    "policy": (("--policy",), f"scheduling policy: {' or '.join(POLICIES)} [default: vllm-v1]"),
    "preemption_mode": (("--preemption-mode", "--preemption"), "recompute or swap [default: recompute]"),
    "allocator": (("--allocator",), "paged, or the paper's baselines orca-max, orca-pow2, orca-oracle "
                                    "(simulator only) [default: paged]"),
    "num_gpu_blocks": (("--num-gpu-blocks",), "KV-cache size in blocks, instead of the memory plan"),
    "num_cpu_blocks": (("--num-cpu-blocks",), "CPU swap space in blocks, instead of --swap-space"),
    "kv_cache_memory_bytes": (("--kv-cache-memory-bytes", "--kv-cache-memory"),
                              "vLLM's: each GPU's KV cache in bytes, instead of what --gpu-memory-utilization "
                              "leaves (vLLM prints the value to give at start-up: \"--kv-cache-memory=N\")"),
    "quantization": (("--quantization", "-q"), "weight format, vLLM's names: fp8, nvfp4, mxfp4, awq or gptq "
                                               "[default: the checkpoint's quantization_config, else 16-bit]"),
    "kv_cache_dtype": (("--kv-cache-dtype",), "KV-cache element type: auto (the model's dtype) or fp8 (E4M3, "
                                              "per-tensor scale) [default: auto]"),
    "async_scheduling": (("--async-scheduling/--no-async-scheduling",),
                         "vLLM's async scheduling: the host prepares the next step while the GPU runs this one "
                         "(the measured cost model hides its host time behind the GPU's, the best case; a request "
                         "arriving during a step joins the step after next) "
                         "[default: vLLM's: on for --policy vllm-v1 on a GPU, off for the paper's policy, the "
                         "CPU and n-gram or draft-model speculation]"),
    "client_turnaround": (("--client-turnaround",),
                          "closed loop (--concurrency): seconds from a request's end in the engine to its client's "
                          "next request in the engine's queue; 0: at once, joining the next step, as in-process "
                          "clients; an API server's clients (vllm bench serve) take e.g. 0.001: the next request "
                          "joins the step after the one running [default: 0]"),
    "max_active_conversations": (("--max-active-conversations",),
                                 "closed loop (--concurrency N) over a trace of conversations: how many "
                                 "conversations the clients keep active in all, each K // N, sending their turns "
                                 "in rotation one at a time (vLLM's multi-turn benchmark; K >= N) [default: one "
                                 "each]"),
    "client_request_rate": (("--client-request-rate",),
                            "closed loop (--concurrency): each client's own request rate, as vLLM's multi-turn "
                            "benchmark's --request-rate: after each request it pauses an exponential time of mean "
                            "1/R minus the request's duration [default: no pause]"),
    "client_early_stop": (("--client-early-stop/--no-client-early-stop",),
                          "closed loop: the clients all stop once one stops (it found no conversation left to "
                          "take, or sent --client-max-requests), the trace's other turns never sent (vLLM's "
                          "multi-turn benchmark's default, --no-early-stop there) [default: off]"),
    "client_max_requests": (("--client-max-requests",),
                            "closed loop: the most requests each client sends before it stops (vLLM's multi-turn "
                            "benchmark's --max-num-requests M over N clients: M // N) [default: no limit]"),
    "client_warmup_step": (("--client-warmup-step/--no-client-warmup-step",),
                           "closed loop over conversations: every conversation's first turn first (one "
                           "conversation a client), left out of the figures; then the later turns (vLLM's "
                           "multi-turn benchmark's --warmup-step) [default: off]"),
    "conversation_sampling": (("--conversation-sampling",),
                              "closed loop over conversations: which of its active conversations a client sends "
                              "the next turn of: round_robin (in rotation) | random (picked at random, as vLLM's "
                              "multi-turn benchmark's --conversation-sampling random picks it) [default: "
                              "round_robin]"),
    "client_warmup_percent": (("--client-warmup-percent",),
                              "closed loop: leave the first X% of the answered requests, in the order sent, out of "
                              "the request figures (vLLM's multi-turn benchmark's --warmup-percentages X%; not with "
                              "--client-warmup-step) [default: 0]"),
    "turns_after_answers": (("--turns-after-answers/--no-turns-after-answers",),
                            "open loop over conversations: send each later turn once the turn before it has "
                            "ended, its think time after (the chatbot and conversation workloads draw one), not "
                            "at its trace time (an estimate); a refused turn ends its conversation [default: "
                            "off]"),
    "stream_interval": (("--stream-interval",),
                        "vLLM's --stream-interval: a streamed answer's first token goes out at once, then its "
                        "tokens N at a time and the rest at its end, so a client's ITL is the gap between "
                        "chunks of N; TTFT, TPOT and E2E are the same (`serve` streams so) [default: 1]"),
    "speculative": (("--speculative",), "speculative decoding, METHOD:K: ngram, eagle, mtp or draft (with --draft-model) with K draft tokens "
                                        "per step [default: off]"),
    "acceptance": (("--acceptance",), "with --speculative: per-position conditional acceptance rates P1,P2,... "
                                      "(required for ngram; eagle and mtp default to published curves, "
                                      "docs/speculative.md); one curve, not a sweep"),
    "draft_rates": (("--draft-rates",), "with --speculative: how often the proposer drafts, per position "
                                        "D1,D2,... (D1: share of decode steps with a draft; Di: drafts reaching "
                                        "token i among those reaching i-1; measured by validate --speculative "
                                        "ngram:K) [default: K drafts every step]; one curve, not a sweep"),
    "draft_persistence": (("--draft-persistence",), "with --draft-rates: the chance a sequence's lookup drafts "
                                                    "right after one that drafted (prompt-lookup drafts come in "
                                                    "runs) [default: D1, no memory]"),
    "draft_model": (("--draft-model",), "with --speculative draft:K: the draft model, a catalog model (the "
                                        "simulator prices its steps) or a local folder (the live engine runs it)"),
    "enable_prefix_caching": (("--enable-prefix-caching/--no-enable-prefix-caching",
                               "--prefix-caching/--no-prefix-caching"), "automatic prefix caching [default: the policy's: on for "
                                                         "vllm-v1, as vLLM v1; off for paper]"),
    "enable_lora": (("--enable-lora/--no-enable-lora",),
                    "serve LoRA adapters (vLLM's): slots for --max-loras adapters of --max-lora-rank on every "
                    "LoRA-able layer, their kernels priced in each step that runs one; which adapter each request "
                    "uses comes with the workload (-p loras=N) or the trace's `lora` [default: off]"),
    "max_loras": (("--max-loras",), "with --enable-lora: the most distinct adapters in one step (vLLM's; a "
                                    "request of another waits) [default: 1]"),
    "max_lora_rank": (("--max-lora-rank",), "with --enable-lora: the largest adapter rank served, one of 1, 8, 16, "
                                            "32, 64, 128, 256, 320, 512 (vLLM's) [default: 16]"),
    "kv_offloading_size": (("--kv-offloading-size",),
                           "vLLM's native CPU KV offloading: GiB of host memory (summed over the GPUs) that keep "
                           "every full KV block behind the prefix cache, so a prefix the GPU lost loads back over "
                           "the host link instead of being recomputed (vllm-v1 with prefix caching) [default: off]"),
    "cpu_offload_gb": (("--cpu-offload-gb",), "vLLM's: GiB of each GPU's weights (its first layers') kept in host "
                                             "memory, read over the host link by every step; the memory they leave "
                                             "goes to the KV cache [default: 0]"),
    "kv_offloading_backend": (("--kv-offloading-backend",), "with --kv-offloading-size: native (vLLM's own; "
                                                            "LMCache is not modelled) [default: native]"),
}
LIST_HELP = " (a comma list sweeps)"
ONE_VALUE = ("acceptance", "draft_rates")  # a comma list that is one value (a curve), not a sweep


def _option(name: str) -> inspect.Parameter:
    flags, help_text = DEPLOYMENT_FLAGS[name]
    if Deployment.field_type(name) is bool:
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[bool],
                                 default=typer.Option(None, *flags, help=help_text))
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str],
                             default=typer.Option(None, *flags, help=help_text + ("" if name in ONE_VALUE else LIST_HELP),
                                                  metavar=Deployment.field_type(name).__name__.upper()))


@dataclass(frozen=True)
class DeploymentChoices:
    """The deployment settings a command was given: field -> the values listed (one unless a comma list)."""

    given: dict[str, tuple]

    def values(self, name: str) -> tuple:
        return self.given.get(name, ())

    def product(self, **defaults) -> list[Deployment]:
        """Every combination of the listed values, over `defaults` (the command's own, e.g. its model)."""
        names = list(self.given)
        combos = itertools.product(*(self.given[n] for n in names))
        try:
            return [Deployment.of(**{**defaults, **dict(zip(names, combo))}) for combo in combos]
        except (TypeError, ValueError) as exc:
            raise PlannerError(str(exc)) from None

    def one(self, command: str, **defaults) -> Deployment:
        """The one deployment a command runs: a comma list is an error naming the flag."""
        for name, values in self.given.items():
            if len(values) > 1:
                raise PlannerError(f"{DEPLOYMENT_FLAGS[name][0][0].split('/')[0]} takes one value for "
                                   f"`planner {command}` (a comma list sweeps in `planner simulate`)")
        return self.product(**defaults)[0]

    def without(self, *names: str) -> DeploymentChoices:
        return DeploymentChoices({k: v for k, v in self.given.items() if k not in names})


def _parse(name: str, text) -> tuple:
    kind = Deployment.field_type(name)
    if kind is bool or name in ONE_VALUE:
        return (text,)
    return tuple(dict.fromkeys(split_values(str(text), kind, DEPLOYMENT_FLAGS[name][0][0].removeprefix("--"))))


def choices_from(options: dict) -> DeploymentChoices:
    """The DeploymentChoices of the options as typer passed them (None: not given)."""
    return DeploymentChoices({name: _parse(name, value) for name, value in options.items()
                              if name in DEPLOYMENT_FLAGS and value is not None})


def deployment_options(command):
    """Add every deployment option to a typer command; the command receives them as `deployments`."""
    return options_as(command, "deployments", [_option(name) for name in DEPLOYMENT_FLAGS],
                      choices_from)


def options_as(command, received: str, added: list[inspect.Parameter], collect):
    """`command` with the `added` options in its signature, handed to it as one argument `received`:
    `collect({option: value})`, whose PlannerError is a one-line failure."""
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != received]

    @functools.wraps(command)
    def wrapper(**kwargs):
        options = {p.name: kwargs.pop(p.name) for p in added}
        try:
            value = collect(options)
        except PlannerError as exc:
            raise fail(exc) from None
        return command(**{received: value}, **kwargs)

    parameters = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + added
    wrapper.__signature__ = inspect.Signature(parameters)
    wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
    del wrapper.__wrapped__                 # typer must read the new signature, not the command's own
    return wrapper


# -- the load, the outputs ------------------------------------------------------------------------

WORKLOAD = typer.Option("sharegpt", help="built-in workload (planner list workloads)")
TRACE = typer.Option(None, "--trace", help="a .jsonl/.csv trace file instead of --workload")
PARAM = typer.Option(None, "--param", "-p", metavar="KEY=VALUE",
                     help="workload parameter KEY=VALUE (planner workload show NAME lists them); repeatable")
REQUESTS = typer.Option(None, "--requests", "-n", help="request count (default 1000 without --duration)")
DURATION = typer.Option(None, help="seconds of arrivals")
CONCURRENCY = typer.Option(None, "--concurrency", metavar="N",
                           help="a closed loop of N clients, each sending its next request the moment its previous "
                                "one ends (the trace gives lengths and order, not times; vLLM bench's "
                                "--max-concurrency with an unlimited rate); with --rate, at most N requests in "
                                "flight, each sent when it arrives or, if N are out, when one ends (vLLM bench's "
                                "--request-rate with --max-concurrency); a comma list sweeps")
BURSTINESS = typer.Option(1.0, "--burstiness", metavar="B",
                          help="vLLM bench's burstiness of the arrivals at the rate: the gaps between them are "
                               "gamma-distributed with shape B (1: Poisson; below 1 burstier, e.g. 0.25; above 1 "
                               "more regular)")
RAMP_UP_STRATEGY = typer.Option(None, "--ramp-up-strategy", metavar="linear|exponential",
                                help="vLLM bench's ramp-up instead of --rate: request i of N is sent at a rate rising "
                                     "from --ramp-up-start-rps to --ramp-up-end-rps with i/(N-1), straight "
                                     "(linear) or geometrically (exponential); needs --requests")
RAMP_UP_START = typer.Option(None, "--ramp-up-start-rps", metavar="RPS", help="the ramp-up's first rate (req/s)")
RAMP_UP_END = typer.Option(None, "--ramp-up-end-rps", metavar="RPS", help="the ramp-up's last rate (req/s)")
REPLICAS = typer.Option(None, "--replicas", metavar="K",
                        help="K identical replicas of the deployment behind --router, simulated together (each its "
                             "own scheduler, KV cache and prefix cache); a comma list sweeps in simulate")
ROUTER = typer.Option(None, "--router", metavar="POLICY",
                      help="how the router picks a replica: round-robin (the default), least-requests (fewest in "
                           "flight), least-kv (lowest KV-cache use), prefix-aware (most prompt blocks cached; needs "
                           "--enable-prefix-caching), session (a conversation's turns on one replica, as the vLLM "
                           "production stack's), or weighted:SCORER=W,... over the last four, as llm-d's "
                           "scorers (e.g. weighted:least-requests=1,prefix-aware=2); a deployment's --dp ranks are "
                           "spread by vllm-dp, vLLM's own balancer, unless --router names another")
SEED = typer.Option(0, help="random seed (trace and sampled tokens)")
SLO = typer.Option(None, "--slo", metavar="LIMIT",
                   help="SLO: s/token (normalized latency) or METRIC=SECONDS, comma-separated or repeated "
                        "(e.g. ttft_p99=2,tpot_p99=0.1)")
SLO_ATTAINMENT = typer.Option(None, "--slo-attainment", metavar="SHARE",
                              help="judge by SLO attainment (DistServe's): each --slo is a limit on every request "
                                   "(ttft_p99=0.5: each TTFT <= 0.5 s) and at least SHARE of the requests (e.g. "
                                   "0.9) must meet them all, the engine keeping up; vLLM bench's --goodput counts "
                                   "the same requests")
PROFILE = typer.Option(None, "--profile", help="profile JSON for the calibrated cost model (default: one under "
                                               "profiles/<gpu>/ matching the run, else measured or roofline)")
COST_MODEL = typer.Option(None, "--cost-model", help="calibrated, measured or roofline (default: a calibrated "
                                                     "profile, else measured vLLM tables, else roofline); or "
                                                     "linear:A,B, every step A + B x scheduled tokens seconds")
STEP_BY_STEP = typer.Option(False, "--step-by-step", help="simulate one step at a time, without decode "
                                                           "fast-forward (same results, slower)")
SEEDS = typer.Option(1, "--seeds", help="simulate K seeds (seed, seed+1, ...) in parallel and report each "
                                        "metric's mean and 90% interval")
TIMING_NOISE = typer.Option(False, "--timing-noise", help="scatter each step's time by the profile's residual "
                                                         "spread (seeded: reproducible)")
OUT = typer.Option(None, "--out", help="output folder (default: a new folder under reports/)")
AS_JSON = typer.Option(False, "--json", help="print one JSON document on stdout; progress on stderr")


def ramp_up_of(strategy: Optional[str], start_rps: Optional[float], end_rps: Optional[float]) -> RampUp | None:
    """The ramp-up the three flags give (None without them), checked in one line."""
    if strategy is None:
        if start_rps is not None or end_rps is not None:
            raise PlannerError("--ramp-up-start-rps and --ramp-up-end-rps shape a ramp-up: give --ramp-up-strategy "
                               "linear or exponential")
        return None
    if start_rps is None or end_rps is None:
        raise PlannerError("--ramp-up-strategy needs both --ramp-up-start-rps and --ramp-up-end-rps")
    ramp_up = RampUp(strategy, start_rps, end_rps)
    ramp_up.check()
    return ramp_up


def workload_source(workload: str, trace: Optional[Path]) -> str:
    return str(trace) if trace else workload


# A live fleet (serve, validate) runs every replica on this machine, each with its own engine and KV cache;
# past this many, a typo would start processes until the machine gives out. A simulated fleet takes any count.
MAX_LIVE_REPLICAS = 64


def check_live_replicas(replicas: int) -> None:
    if not 1 <= replicas <= MAX_LIVE_REPLICAS:
        raise PlannerError(f"--replicas {replicas}: a live fleet runs 1 to {MAX_LIVE_REPLICAS} replicas on this "
                           f"machine (planner simulate --replicas sizes a larger one)")


def replica_counts(text: Optional[str]) -> tuple[int, ...]:
    """--replicas: one count or a comma list (1 when not given)."""
    if text is None:
        return (1,)
    counts = tuple(dict.fromkeys(split_values(str(text), int, "replicas")))
    if any(k < 1 for k in counts):
        raise PlannerError(f"--replicas must be >= 1, got {text}")
    return counts
