"""One `Deployment`: every knob of a served model, with vLLM's names and one set of defaults.

The live engine (`LLM`, `LLMEngine`), the simulator, every `planner` command
and the planner's Python API take or build one, so a knob is added here once
and reaches them all. Pure Python (no torch): the simulator imports it.

- `model`, `gpu`, `tp` say what is served where: a catalog name, a Hugging
  Face id or a model folder; a catalog GPU; the tensor-parallel size. The
  planner prices them; the live engine loads `model` from a folder and runs on
  the device it has.
- `pp` is vLLM's `--pipeline-parallel-size`: the layers split into pp consecutive stages of tp GPUs
  each, with pp batches in flight (planner/sim/pipeline.py). The planner prices it for the vllm-v1
  policy (no dp, P/D or speculation); the engine runs pp = 1.
- `node_link` is the network between 8-GPU nodes that a deployment's collectives and pipeline stages
  cross once it takes more than one node: a link of the planner's catalog (planner/data/links.json:
  infiniband, one 400 Gb/s NIC per GPU, or ethernet, 100 GbE). Hardware, not a vLLM setting.
- `disable_custom_all_reduce` is vLLM's `--disable-custom-all-reduce`: TP's all-reduces go through NCCL
  instead of vLLM's custom all-reduce kernel (which vLLM otherwise uses inside one node over NVLink, or
  over PCIe between two GPUs, for messages up to its 8 MiB buffer). The measured model prices them from
  NVIDIA's NCCL table then; the roofline prices every all-reduce alike; the engine runs tp = 1.
- `dp` and `enable_expert_parallel` are vLLM's `--data-parallel-size` and `--enable-expert-parallel`:
  dp attention replicas inside one deployment (each with its own scheduler and KV cache, tp GPUs
  each), whose MoE layers run over all tp x dp GPUs: each expert's width split across them, or with
  expert parallelism whole experts (EP = tp x dp). The planner prices them; the engine runs dp = 1.
- `all2all_backend` is vLLM's `--all2all-backend`: how expert parallelism with dp > 1 moves each MoE
  layer's tokens to their experts and back: "allgather_reducescatter" (vLLM's default, NCCL),
  "deepep_low_latency" or "deepep_high_throughput" (DeepEP's kernels, priced from DeepEP's
  published rates: planner/cost/all2all.py). The engine runs dp = 1 and moves nothing.
- `enable_eplb` and `num_redundant_experts` are vLLM's `--enable-eplb` and `--eplb-config`'s
  `num_redundant_experts`: the expert-parallel load balancer, whose redundant copies of the busiest
  experts each EP rank holds beside its own ((E + R) / EP experts a rank). The planner counts their
  weights; its routing model already places the hottest experts one per rank, as EPLB aims to.
- `moe_backend` is vLLM's `--moe-backend`, the kernel that runs a MoE's experts: "triton" (the fused-MoE
  kernel NVIDIA's tables time), "deep_gemm" (DeepSeek's grouped FP8 GEMMs, priced at DeepGEMM's published
  rates where they exist: planner/cost/deepgemm.py) or "auto" (vLLM's choice: DeepGEMM behind DeepEP's
  all-to-all for block-FP8 experts, NVIDIA's timing of vLLM's own choice otherwise).
- `enable_dbo`, `dbo_decode_token_threshold` and `dbo_prefill_token_threshold` are vLLM's dual-batch overlap
  and its thresholds: a step of at least that many tokens (a uniform decode's, or any other's) runs as two
  microbatches, one's DeepEP all-to-all hidden under the other's compute (planner/cost/dbo.py). vLLM refuses
  it unless `all2all_backend` is one of DeepEP's. The planner prices it; the engine runs dp = 1.
- `moe_skew` is the MoE router's skew the planner assumes: experts' popularity falls as a power law,
  p_e ~ (e + 1) ** -moe_skew (0: uniform routing; NVIDIA measured vLLM's MoE kernels at 1.01 and 1.2,
  docs/moe.md). It sets how many experts a batch touches and how unevenly EP ranks are loaded.
- `policy` is the scheduler: "vllm-v1" (the default: a token budget per step,
  decodes first, prompts in chunks, as vLLM 0.19 deploys) or "paper" (vLLM
  v0.2.0, the PagedAttention paper's: prefill-only or decode-only steps).
- `max_num_seqs`, `max_num_batched_tokens` and `enable_prefix_caching` default
  to None: the policy's own defaults on the device that runs it, filled in by
  `resolve_batch_limits` (vLLM v1: prefix caching on and vLLM's per-device
  token budget and sequence limit; paper: 256 sequences, a budget of
  max(max_model_len, 2048), no prefix caching). The planner resolves against
  the catalog GPU, the live engine against its device; what either runs and
  records is the resolved deployment. `max_model_len` None: the model's own.
- `long_prefill_token_threshold` is vLLM's `--long-prefill-token-threshold`: the
  most tokens one request takes in a step under the vllm-v1 policy, so a long
  prompt is prefilled in chunks of at most that many and leaves the rest of
  the budget to other prompts (vllm/v1/core/sched/scheduler.py applies it to
  running and waiting requests alike, before the budget); 0, vLLM's default,
  caps a chunk at the budget alone.
- `performance_mode` is vLLM's `--performance-mode` (vllm/config/vllm.py, 0.17-0.19): "throughput"
  doubles the default token budget and sequence limit (`resolve_batch_limits`; a value given stays as
  given); "interactivity" captures a CUDA graph for every batch of 1 to 32 tokens, so small steps are
  not padded (the measured model's graph sizes); "balanced" is vLLM's default. The kernels vLLM picks
  per mode are not modelled.
- `allocator` is the simulator's KV policy; anything but "paged" is one of the
  paper's contiguous baselines, which only the simulator runs.
- `num_gpu_blocks` / `num_cpu_blocks` set the KV cache directly instead of the
  memory plan (vLLM's `--num-gpu-blocks-override`).
- `kv_cache_memory_bytes` is vLLM's `--kv-cache-memory-bytes` (`--kv-cache-memory`): each GPU's KV cache
  in bytes, cut into blocks, instead of what `gpu_memory_utilization` leaves after the weights, the
  profile run's peak and non-torch memory (vllm/v1/worker/gpu_worker.py `determine_available_memory`
  skips its memory profiling when it is set; vLLM 0.11 and later print the value to give at every
  start-up: "Replace gpu_memory_utilization config with `--kv-cache-memory=N`"). `num_gpu_blocks`
  overrides it, as vLLM's override does.
- `quantization` is vLLM's `--quantization` (the weights' format: fp8, nvfp4,
  mxfp4, awq, gptq; None: the checkpoint's own, 16-bit unless its config.json
  says otherwise); `kv_cache_dtype` is vLLM's `--kv-cache-dtype` ("auto": the
  model's dtype; "fp8": FP8 E4M3 with a per-tensor scale, as vLLM stores it on
  CUDA, where "fp8_e4m3" is the same format).
- `async_scheduling` is vLLM's `--async-scheduling`: the engine schedules and
  prepares step N+1 while the GPU runs step N. The measured cost model then
  hides its fitted host time behind the GPU time (the best case; off: in
  series, as the vLLM 0.12 runs it was calibrated on), and the simulator
  schedules as vLLM then does: a request that arrives while step N runs joins
  step N+2, not N+1 (planner/sim/engine.py `_admit_held`). None (the default)
  is vLLM's own default, filled in by `resolve_batch_limits` (`vllm_async_default`):
  on for the vllm-v1 policy on a GPU, as vLLM 0.19 serves. This engine
  schedules synchronously: it refuses True and runs None as off.
- `client_turnaround` is how a closed loop's clients reach the engine: the
  seconds from a request's end in the engine to its client's next request in
  the engine's queue (planner/sim/clients.py). 0: at once, as clients in the
  engine's process (the `LLM` class, validate's live engine); the next
  request joins the very next step. A client of an API server gets its answer
  and sends again through HTTP and the tokenizer while the engine runs its
  next step, so its request joins the step after that (`vllm bench serve
  --max-concurrency` against `vllm serve`): any turnaround shorter than a step
  gives that. Open-loop arrivals (a rate, a trace's times) do not read it.
- `max_active_conversations` is the multi-turn benchmark's `--max-active-conversations`
  (vLLM's benchmarks/multi_turn): how many conversations a closed loop's N clients keep
  active in all, each client K // N, sending their turns in rotation one request at a
  time (workloads/clients.py); None: one each. K < N, or no closed loop, is refused.
- `client_request_rate` is that benchmark's `--request-rate R`, a rate per client: after each
  request a client pauses an exponential time of mean 1/R minus the request's duration (none
  when that is not positive), drawn per request (workloads/clients.py `pause`), before its
  next (after `client_turnaround`); None: no pause. It needs a closed loop.
- A client stops, as that benchmark's do, when it finds no conversation left to take (leaving
  the turns of its other active conversations unsent) or has sent `client_max_requests` (the
  benchmark's `--max-num-requests M`, M // N a client; None: no limit).
  `client_early_stop` is that benchmark's early stop (its default; `--no-early-stop` there): the
  first client to stop stops them all, and the trace's turns not yet sent are never sent, so a
  run's figures leave out the tail where fewer clients remain. Off (the default): the other
  clients go on, and with one conversation each every request of the trace is sent, as `vllm
  bench serve` sends its prompts.
- `client_warmup_step` is that benchmark's `--warmup-step`: first the clients, one conversation
  each, send every conversation's first turn; when all have ended new clients send the later
  turns (conversations in the order their first turns ended) by the rules above, and the run's
  request figures (latencies, throughput over their span) leave the warm-up's requests out, as
  the benchmark does; the step figures and the prefix-cache hit rate cover the whole run.
- `conversation_sampling` is that benchmark's `--conversation-sampling`: "round_robin" (its
  default; a client turns to its conversations in rotation) or "random" (it picks one at random
  for each request, with the benchmark's own generator: workloads/clients.py).
- `client_warmup_percent` is that benchmark's `--warmup-percentages X%` (one value): the run's
  request figures leave out the first X% of its answered requests in the order they were sent,
  as its statistics drop the first X% of its samples by start time; not with a warm-up step.
- `turns_after_answers` times an open loop's conversations as their users would: each later turn is
  sent once the turn before it has ended (its `think_time` after that end when the trace gives one, else
  at its trace time but never before that end), not at its trace time, an estimate; a refused turn ends
  its conversation (workloads/sessions.py). Off (the default): every request at its trace time. Not with
  a closed loop, whose clients already wait for their answers.
- `stream_interval` is vLLM's `--stream-interval` (0.11.1 and later): the API
  server sends a streamed answer's first token at once, then its tokens N at a
  time, and the rest when it ends (vllm/v1/engine/output_processor.py,
  RequestState.make_request_output). A client then times chunks of N tokens:
  vLLM bench's ITL is the gap between chunks, about N decode steps; TTFT, E2E
  and TPOT are the same. The records' token times are the chunks' times
  (engine/core/metrics.py `streamed_times`; a speculative step's accepted tokens
  count one each), and `planner serve` streams so.
- `speculative` is speculative decoding as the simulator models it, "METHOD:K" (METHOD ngram,
  eagle, mtp or draft; K draft tokens per step; None: off), and `acceptance` the per-position
  conditional acceptance rates "P1,P2,..." (a user-given curve; eagle and mtp default to
  published ones, planner/sim/speculative.py). The live engine runs "ngram:K" as vLLM's
  `speculative_config` with k = K and refuses the rest (docs/speculative.md). `draft_rates`
  "D1,D2,..." says how often the proposer drafts at all: D1 the share of a sequence's decode steps
  that get a draft, Di the share of drafts reaching position i among those reaching i - 1 (n-gram
  lookup drafts only where the text repeats itself; None: every step drafts K, as EAGLE and MTP
  heads do); `draft_persistence` the chance a lookup drafts right after one that drafted (None: D1;
  drafts from prompt lookup come in runs). A live run measures all three
  (`SpecDecodingStats.draft_rates`, `.draft_persistence`, `.acceptance_rates`). `draft_model` is
  the draft model of "draft:K": a folder the live engine loads, or a catalog model the simulator
  prices.
- `enable_lora`, `max_loras` and `max_lora_rank` are vLLM's `--enable-lora`, `--max-loras` (the most
  distinct adapters in one step, default 1) and `--max-lora-rank` (the largest adapter rank it serves,
  one of vLLM's sizes, default 16): vLLM holds max_loras adapter slots of that rank on every LoRA-able
  layer, the scheduler passes over a waiting request of another adapter while max_loras run, and each
  step runs the adapters' shrink and expand kernels beside every such layer (docs/lora.md). Which
  adapter each request uses comes with the workload (`loras`, as vLLM bench's `--lora-modules`).
  vllm-v1 policy only (vLLM v0.2.0 had no LoRA).
- `kv_offloading_size` is vLLM's `--kv-offloading-size`: GiB of host memory (summed over the ranks) for
  its native CPU offloading, a second prefix cache behind the GPU's: every full block is also stored
  there, and a request whose prefix the GPU has lost loads it back instead of recomputing it
  (engine/core/kv_offload.py). `kv_offloading_backend` is `--kv-offloading-backend`: `native` only
  (LMCache keeps its cache in a server of its own, which is not modelled). vllm-v1 policy with prefix
  caching only.
- `cpu_offload_gb` is vLLM's `--cpu-offload-gb`: GiB of each GPU's weights (its first layers' parameters)
  kept in host memory and read over the host link by every forward (vLLM's UVA offloader); the GPU's
  memory they leave goes to the KV cache. Only the planner prices it (this engine's weights are where its
  device reads them).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, fields, replace

from engine.core.allocators import ALLOCATORS
from engine.core.config import (DEFAULT_MAX_NUM_BATCHED_TOKENS, PREEMPTION_MODES, SCHEDULING_POLICIES,
                               SIM_BLOCK_SIZES, SUPPORTED_BLOCK_SIZES, SchedulerConfig)

POLICIES = ("paper", "vllm-v1")
DTYPES = ("auto", "float16", "bfloat16", "float32")
DTYPE_ALIASES = {"half": "float16", "fp16": "float16", "bf16": "bfloat16", "float": "float32", "fp32": "float32"}
# vLLM's --quantization names of the weight formats the planner knows (vllm/model_executor/layers/quantization);
# modelopt_mixed only names what a checkpoint's config declares (each layer's format is in it).
QUANTIZATIONS = ("fp8", "nvfp4", "mxfp4", "awq", "gptq", "modelopt_mixed")
# Speculative methods the `speculative` setting names (the simulator refuses "draft" in one line).
SPECULATIVE_METHODS = ("ngram", "eagle", "mtp", "draft")
# vLLM's --kv-cache-dtype: "fp8" is E4M3 on CUDA, the same as "fp8_e4m3" (vllm/config/cache.py CacheDType).
KV_CACHE_DTYPES = ("auto", "fp8")
KV_CACHE_DTYPE_ALIASES = {"fp8_e4m3": "fp8"}
# vLLM's --all2all-backend choices the planner prices (planner/cost/all2all.py); the first is vLLM's default.
ALL2ALL_BACKENDS = ("allgather_reducescatter", "deepep_low_latency", "deepep_high_throughput")
MAX_SWAP_GIB = 1 << 20                   # GiB of swap space per GPU: a pebibyte, past any host's memory
# vLLM's --moe-backend choices the planner prices (planner/cost/deepgemm.py); the first is vLLM's default.
MOE_BACKENDS = ("auto", "triton", "deep_gemm")
# vLLM's --performance-mode (vllm/config/vllm.py PerformanceMode, since 0.17); the first is vLLM's default.
PERFORMANCE_MODES = ("balanced", "interactivity", "throughput")
# vLLM's --max-lora-rank choices (vllm/config/lora.py MaxLoRARanks); 16 is its default.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class Deployment:
    model: str = "opt-13b"
    gpu: str = "a100-40g"
    tp: int = 1
    pp: int = 1                              # pipeline-parallel size: stages of the layers, tp GPUs each
    dp: int = 1                              # data-parallel size: attention replicas inside the deployment
    node_link: str = "infiniband"            # the network between nodes (the planner's links catalog)
    disable_custom_all_reduce: bool = False  # vLLM's: every TP all-reduce through NCCL, not vLLM's own kernel
    enable_expert_parallel: bool = False     # MoE experts split whole over tp x dp GPUs (EP), not by width
    all2all_backend: str = ALL2ALL_BACKENDS[0]  # how EP moves tokens to their experts (vLLM's --all2all-backend)
    enable_eplb: bool = False                # vLLM's expert-parallel load balancer
    num_redundant_experts: int = 0           # EPLB's extra expert copies (vLLM's eplb_config.num_redundant_experts)
    moe_backend: str = MOE_BACKENDS[0]       # the experts' kernel (vLLM's --moe-backend): auto, triton, deep_gemm
    enable_dbo: bool = False                 # vLLM's dual-batch overlap (needs a DeepEP all2all backend)
    dbo_decode_token_threshold: int = 32     # a uniform decode splits from this many tokens (vLLM's default)
    dbo_prefill_token_threshold: int = 512   # any other step from this many (vLLM's default)
    moe_skew: float = 0.0                    # MoE routing skew: power-law exponent of expert popularity (0: uniform)
    dtype: str = "auto"
    block_size: int = 16
    max_num_seqs: int | None = None          # None: the policy's default on the device (resolve_batch_limits)
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool | None = None   # vLLM's; None: the policy's (on for vllm-v1; paper: none)
    long_prefill_token_threshold: int = 0    # vLLM's: most tokens one request takes in a step (0: the budget)
    scheduling_policy: str = SCHEDULING_POLICIES[0]   # vLLM's --scheduling-policy: fcfs, or priority (vllm-v1)
    performance_mode: str = PERFORMANCE_MODES[0]   # vLLM's --performance-mode: its batch and CUDA-graph defaults
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    swap_space: float = 4.0                  # GiB of CPU swap space per GPU
    enable_prefix_caching: bool | None = None  # None: the policy's default (on for vllm-v1, as vLLM's)
    policy: str = "vllm-v1"
    preemption_mode: str = "recompute"
    allocator: str = "paged"
    num_gpu_blocks: int | None = None
    num_cpu_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None  # vLLM's: each GPU's KV cache in bytes (None: the memory plan's)
    quantization: str | None = None          # None: as the checkpoint is (16-bit unless its config says)
    kv_cache_dtype: str = "auto"
    async_scheduling: bool | None = None     # vLLM's --async-scheduling; None: vLLM's default (vllm_async_default)
    client_turnaround: float = 0.0           # closed loop: s from a request's end to its client's next request
    max_active_conversations: int | None = None   # closed loop: conversations all clients keep active (None: 1 each)
    client_request_rate: float | None = None  # closed loop: each client's own rate, a pause after each request
    client_early_stop: bool = False          # closed loop: stop all clients once one stops
    client_max_requests: int | None = None   # closed loop: the most requests a client sends (None: no limit)
    client_warmup_step: bool = False         # closed loop: first turns first, out of the figures
    conversation_sampling: str = "round_robin"   # closed loop: which active conversation a client turns to
    client_warmup_percent: float = 0.0       # closed loop: the first X% of the answered requests out of the figures
    turns_after_answers: bool = False        # open loop: a conversation's later turn sent after its answer
    stream_interval: int = 1                 # vLLM's --stream-interval: a streamed answer's tokens sent N at a time
    speculative: str | None = None           # "METHOD:K", e.g. "eagle:3"; None: no speculative decoding
    acceptance: str | None = None            # "P1,P2,...": per-position conditional acceptance rates
    draft_rates: str | None = None           # "D1,D2,...": per-position conditional drafting rates (None: always K)
    draft_persistence: float | None = None   # P(a lookup drafts | the sequence's last lookup drafted); None: D1
    draft_model: str | None = None           # --speculative draft:K: the draft model (a folder, or a catalog name)
    enable_lora: bool = False                # vLLM's --enable-lora: serve LoRA adapters beside the base model
    max_loras: int = 1                       # vLLM's --max-loras: the most distinct adapters in one step
    max_lora_rank: int = 16                  # vLLM's --max-lora-rank: the largest adapter rank it serves
    kv_offloading_size: float | None = None  # vLLM's --kv-offloading-size: GiB of host memory for KV blocks
    kv_offloading_backend: str = "native"    # vLLM's --kv-offloading-backend (native only)
    cpu_offload_gb: float = 0.0              # vLLM's --cpu-offload-gb: GiB of each GPU's weights in host memory

    def __post_init__(self) -> None:
        for name, (kind, optional) in _FIELD_KINDS.items():    # each setting's type first: see check_type
            check_type(name, getattr(self, name), kind, optional)
        object.__setattr__(self, "dtype", DTYPE_ALIASES.get(self.dtype, self.dtype))   # vLLM's spellings too
        object.__setattr__(self, "kv_cache_dtype", KV_CACHE_DTYPE_ALIASES.get(self.kv_cache_dtype,
                                                                              self.kv_cache_dtype))
        if self.quantization is not None:
            _one_of("quantization", self.quantization, QUANTIZATIONS)
        if self.kv_cache_dtype == "fp8_e5m2":
            raise ValueError("kv_cache_dtype 'fp8_e5m2' is not supported here; use fp8 (E4M3, as vLLM on CUDA)")
        _one_of("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        _one_of("policy", self.policy, POLICIES)
        _one_of("all2all_backend", self.all2all_backend, ALL2ALL_BACKENDS)
        _one_of("moe_backend", self.moe_backend, MOE_BACKENDS)
        _one_of("performance_mode", self.performance_mode, PERFORMANCE_MODES)
        _one_of("scheduling_policy", self.scheduling_policy, SCHEDULING_POLICIES)
        if self.scheduling_policy != SCHEDULING_POLICIES[0] and not self.vllm_v1:
            raise ValueError("priority scheduling is vLLM v1's (--policy vllm-v1): the paper's policy is FCFS")
        if self.performance_mode != PERFORMANCE_MODES[0] and self.policy != "vllm-v1":
            raise ValueError(f"performance_mode {self.performance_mode!r} is a setting of vLLM v1 (0.17 and later): "
                             f"give --policy vllm-v1")
        _check_eplb(self)
        _check_dbo(self)
        _check_lora(self)
        _check_offloading(self)
        if self.speculative is not None and str(self.speculative).lower() in ("none", "off"):     # off, as in a sweep "none,eagle:3"
            object.__setattr__(self, "speculative", None)
            object.__setattr__(self, "acceptance", None)
            object.__setattr__(self, "draft_rates", None)
            object.__setattr__(self, "draft_persistence", None)
            object.__setattr__(self, "draft_model", None)
        if self.speculative is not None:
            object.__setattr__(self, "speculative", "%s:%d" % parse_speculative(self.speculative))
        if self.acceptance is not None:
            if self.speculative is None:
                raise ValueError("--acceptance needs --speculative METHOD:K")
            object.__setattr__(self, "acceptance", ",".join(f"{p:g}" for p in parse_acceptance(self.acceptance)))
        if self.draft_rates is not None:
            if self.speculative is None:
                raise ValueError("--draft-rates needs --speculative METHOD:K")
            object.__setattr__(self, "draft_rates", ",".join(f"{p:g}" for p in parse_acceptance(self.draft_rates,
                                                                                               "--draft-rates")))
        if self.draft_model is not None and (self.speculative or "").partition(":")[0] != "draft":
            raise ValueError("--draft-model needs --speculative draft:K")
        if self.draft_persistence is not None and not 0 <= self.draft_persistence <= 1:
            raise ValueError(f"--draft-persistence must be in [0, 1], got {self.draft_persistence}")
        _one_of("preemption mode", self.preemption_mode, PREEMPTION_MODES)
        _one_of("KV allocator", self.allocator, ALLOCATORS)
        _one_of("dtype", self.dtype, DTYPES)
        if self.block_size not in SIM_BLOCK_SIZES:
            raise ValueError(f"block_size {self.block_size} is not supported; choose one of "
                             f"{', '.join(map(str, SUPPORTED_BLOCK_SIZES))} (the simulator also takes "
                             f"{', '.join(str(b) for b in SIM_BLOCK_SIZES if b not in SUPPORTED_BLOCK_SIZES)})")
        for name in ("tp", "pp", "dp", "max_num_seqs", "max_num_batched_tokens", "max_model_len", "num_gpu_blocks",
                     "kv_cache_memory_bytes"):
            _at_least(name, getattr(self, name), 1)
        _at_least("num_cpu_blocks", self.num_cpu_blocks, 0)
        _at_least("long_prefill_token_threshold", self.long_prefill_token_threshold, 0)
        if self.enable_chunked_prefill and not self.vllm_v1:
            raise ValueError("chunked prefill is vLLM v1's (--policy vllm-v1): the paper's policy prefills each "
                             "prompt whole")
        if self.long_prefill_token_threshold and not self.vllm_v1:
            raise ValueError("long_prefill_token_threshold caps the chunks of the vllm-v1 policy's prefill: "
                             "the paper's policy prefills each prompt whole")
        if not 0 <= self.swap_space <= MAX_SWAP_GIB:
            raise ValueError(f"swap_space must be a number of GiB from 0 to {MAX_SWAP_GIB:,}, got {self.swap_space}")
        if not 0 <= self.moe_skew <= 4:
            raise ValueError(f"moe_skew must be in [0, 4] (a power-law exponent; 0 is uniform routing), "
                             f"got {self.moe_skew}")
        _at_least("stream_interval", self.stream_interval, 1)
        _at_least("max_active_conversations", self.max_active_conversations, 1)
        if self.client_request_rate is not None and not 0 < self.client_request_rate < math.inf:
            raise ValueError(f"client_request_rate must be a positive, finite number of requests/s, "
                             f"got {self.client_request_rate}")
        if not 0 <= self.client_turnaround < math.inf:
            raise ValueError(f"client_turnaround must be a finite number of seconds >= 0, got {self.client_turnaround}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.vllm_v1 and self.allocator != "paged":
            raise ValueError(f"the vllm-v1 policy needs the paged allocator, not {self.allocator}")
        if self.enable_prefix_caching and self.allocator != "paged":     # (a contiguous chunk is no one's to share)
            raise ValueError(f"prefix caching shares KV blocks, which the {self.allocator} allocator has not: "
                             f"give the paged allocator")
        if self.vllm_v1 and self.preemption_mode != "recompute":
            raise ValueError("the vllm-v1 policy preempts by recompute only (as vLLM v1 does), "
                             f"not {self.preemption_mode!r}")

    @classmethod
    def of(cls, base: Deployment | None = None, **knobs) -> Deployment:
        """`base` (or the defaults) with `knobs` changed; `enable_chunked_prefill=True` asks for the vllm-v1
        policy, whose alone it is. An unknown knob is a TypeError, as a misspelled keyword is."""
        if knobs.get("enable_chunked_prefill"):
            knobs.setdefault("policy", "vllm-v1")
        unknown = sorted(set(knobs) - {f.name for f in fields(cls)})
        if unknown:
            raise TypeError(f"unknown deployment setting {unknown[0]!r}")
        return replace(base or cls(), **knobs)

    @classmethod
    def field_type(cls, name: str) -> type:
        """bool, int, float or str: the type of a setting's values (None aside)."""
        hint = next(f.type for f in fields(cls) if f.name == name)
        return next(kind for kind in (bool, int, float, str) if str(hint).startswith(kind.__name__))

    @classmethod
    def parse_value(cls, name: str, text: str):
        """A setting's value from text (a flag, a Prometheus label): '16' -> 16, 'True' -> True."""
        kind = cls.field_type(name)
        if kind is bool:
            if str(text).lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"{name}: {text!r} is not true or false")
            return str(text).lower() in ("true", "1")
        if kind is int:
            return int(float(text)) if float(text).is_integer() else int(text)
        return kind(text)

    @property
    def gpus(self) -> int:
        """The GPUs one such deployment takes: tp x pp for each of its dp replicas."""
        return self.tp * self.pp * self.dp

    @property
    def num_speculative_tokens(self) -> int:
        """K of `speculative` "METHOD:K" (vLLM's num_speculative_tokens); 0 without speculation."""
        return parse_speculative(self.speculative)[1] if self.speculative is not None else 0

    @property
    def vllm_v1(self) -> bool:
        """Whether the policy is vLLM v1's scheduler (chunked prefill or not), not the paper's."""
        return self.policy == "vllm-v1"

    @property
    def chunked_prefill_on(self) -> bool:
        """enable_chunked_prefill, or where it is None the policy's default: on under vLLM v1 (vLLM's
        default for a model that supports it), none in the paper's vLLM."""
        return self.vllm_v1 if self.enable_chunked_prefill is None else self.enable_chunked_prefill

    def replace(self, **changes) -> Deployment:
        return replace(self, **changes)

    @property
    def prefix_caching_on(self) -> bool:
        """enable_prefix_caching, or where it is None the policy's default: vLLM v1 caches prefixes
        (vllm/engine/arg_utils.py, EngineArgs._set_default_chunked_prefill_and_prefix_caching_args), the
        paper's vLLM did not."""
        return self.policy == "vllm-v1" if self.enable_prefix_caching is None else self.enable_prefix_caching

    @property
    def resolved(self) -> bool:
        """Whether the policy's defaults are filled in (`resolve_batch_limits`)."""
        return (self.max_num_seqs is not None and self.enable_prefix_caching is not None
                and self.enable_chunked_prefill is not None)

    def scheduler_config(self, max_model_len: int, max_num_batched_tokens: int | None = None) -> SchedulerConfig:
        """The scheduler's limits once the model's context is known (the policy fills in the budget). A
        deployment not yet resolved gets the defaults of a device with no name and no memory (vLLM's
        fallback when it cannot ask the device: 2048 tokens, 256 sequences)."""
        if not self.resolved:
            return resolve_batch_limits(self, BatchDevice(), max_model_len).scheduler_config(
                max_model_len, max_num_batched_tokens)
        return SchedulerConfig(max_model_len=max_model_len, max_num_seqs=self.max_num_seqs,
                               max_num_batched_tokens=max_num_batched_tokens or self.max_num_batched_tokens,
                               preemption_mode=self.preemption_mode, block_size=self.block_size,
                               enable_prefix_caching=self.enable_prefix_caching, vllm_v1=self.vllm_v1,
                               enable_chunked_prefill=self.enable_chunked_prefill,
                               long_prefill_token_threshold=self.long_prefill_token_threshold,
                               scheduling_policy=self.scheduling_policy,
                               max_loras=self.max_loras if self.enable_lora else None)

    def as_dict(self) -> dict:
        return asdict(self)

    def changed(self) -> dict:
        """The settings that differ from the defaults, in field order."""
        default = Deployment()
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) != getattr(default, f.name)}


# Each setting's kind and whether it takes None, from its annotation: "int | None" -> (int, True).
_FIELD_KINDS = {f.name: (Deployment.field_type(f.name), "None" in f.type) for f in fields(Deployment)}


@dataclass(frozen=True)
class BatchDevice:
    """What vLLM's batch defaults depend on: the device's total memory, its name, and whether it is the
    CPU. The defaults (no memory, no name) are vLLM's fallback when the device cannot be asked."""

    memory_bytes: int = 0
    name: str = ""
    is_cpu: bool = False


PAPER_MAX_NUM_SEQS = 256        # vLLM v0.2.0's default max_num_seqs (the paper's policy)
_GIB = 1 << 30


def vllm_batch_defaults(device: BatchDevice, world_size: int) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM v1 defaults to for the OpenAI API server
    (UsageContext.OPENAI_API_SERVER, what `vllm serve` runs) on `device`, world_size = TP x PP GPUs.
    From vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults: 70 GiB or more of device memory and
    not an A100 (vLLM measured a larger budget losing throughput on A100, its PR #17885): 8192 tokens
    and 1024 sequences; any other GPU 2048 and 256; the CPU 2048 and 128 per rank of the world. These are
    vLLM 0.19's (unchanged through 0.27); from 0.28 a GPU of 160 GiB or more (B200, B300, GB200, GB300)
    gets 16384 tokens, which `--max-num-batched-tokens 16384` gives the planner."""
    if device.is_cpu:
        return 2048 * world_size, 128 * world_size
    if device.memory_bytes >= 70 * _GIB and "a100" not in device.name.lower():
        return 8192, 1024
    return 2048, 256


def vllm_async_default(dep: Deployment, device: BatchDevice) -> bool:
    """Whether vLLM schedules `dep` asynchronously when it is not told: since vLLM turned async scheduling
    on by default (vllm-project/vllm#27614; SchedulerConfig.async_scheduling None, resolved in
    vllm/config/vllm.py VllmConfig.__post_init__), on unless a feature it cannot overlap is on, of which
    the planner models speculative decoding other than EAGLE and MTP (n-gram lookup on the CPU, a draft
    model). Off under the paper's policy (vLLM v0.2.0 had no such loop) and on the CPU, where the planner
    simulates this engine, which schedules synchronously. With pipeline parallelism the engine core's pp
    batches in flight are the overlap either way (planner/sim/pipeline.py)."""
    if dep.policy != "vllm-v1" or device.is_cpu:
        return False
    return dep.speculative is None or dep.speculative.partition(":")[0] in ("eagle", "mtp")


def resolve_batch_limits(dep: Deployment, device: BatchDevice, max_model_len: int) -> Deployment:
    """`dep` with the policy's defaults filled in where it left them None: the one place both the planner
    (for the catalog GPU) and the live engine (for its device) resolve them. A value given always wins.

    vllm-v1: prefix caching and chunked prefill on, and the budget and sequence limit of `vllm_batch_defaults`
    (twice both under performance_mode "throughput"), then, as vllm/engine/arg_utils.py's
    EngineArgs._set_default_max_num_seqs_and_batched_tokens_args does, a defaulted budget raised to
    max_model_len without chunked prefill and capped at max_num_seqs x max_model_len, and a defaulted
    max_num_seqs capped at the budget.
    paper (vLLM v0.2.0): 256 sequences, a budget of max(max_model_len, 2048), no prefix caching. Async
    scheduling: `vllm_async_default` where None."""
    dep = replace(dep, enable_prefix_caching=dep.prefix_caching_on, enable_chunked_prefill=dep.chunked_prefill_on)
    if dep.async_scheduling is None:
        dep = replace(dep, async_scheduling=vllm_async_default(dep, device))
    if dep.policy != "vllm-v1":
        seqs = PAPER_MAX_NUM_SEQS if dep.max_num_seqs is None else dep.max_num_seqs
        budget = dep.max_num_batched_tokens or max(max_model_len, DEFAULT_MAX_NUM_BATCHED_TOKENS)
        return replace(dep, max_num_seqs=seqs, max_num_batched_tokens=budget)
    default_budget, default_seqs = vllm_batch_defaults(device, dep.tp * dep.pp)
    if dep.performance_mode == "throughput":         # vLLM doubles both defaults (not a value given)
        default_budget, default_seqs = 2 * default_budget, 2 * default_seqs
    seqs = default_seqs if dep.max_num_seqs is None else dep.max_num_seqs
    budget = dep.max_num_batched_tokens
    if budget is None:
        if not dep.enable_chunked_prefill:          # a whole prompt must fit one step's budget
            default_budget = max(max_model_len, default_budget)
        budget = min(seqs * max_model_len, default_budget)
    if dep.max_num_seqs is None:
        seqs = min(seqs, budget)
    return replace(dep, max_num_seqs=seqs, max_num_batched_tokens=budget)


def parse_speculative(text: str) -> tuple[str, int]:
    """("eagle", 3) from "eagle:3"; a ValueError in one line for anything else."""
    method, sep, k = str(text).strip().partition(":")
    method = method.strip().lower()
    if not sep or method not in SPECULATIVE_METHODS or not k.strip().isdigit() or int(k) < 1:
        raise ValueError(f"--speculative {text!r}: give METHOD:K with METHOD one of "
                         f"{', '.join(SPECULATIVE_METHODS)} and K >= 1 draft tokens (e.g. eagle:3)")
    return method, int(k)


def parse_acceptance(text: str, flag: str = "--acceptance") -> tuple[float, ...]:
    """(0.8, 0.6) from "0.8,0.6": per-position conditional rates (of acceptance, or with
    flag="--draft-rates" of drafting), each in [0, 1]."""
    try:
        rates = tuple(float(p) for p in str(text).replace(" ", "").split(","))
    except ValueError:
        rates = ()
    if not rates or any(not 0 <= p <= 1 for p in rates):
        what = "drafting" if flag == "--draft-rates" else "acceptance"
        raise ValueError(f"{flag} {text!r}: give per-position {what} rates P1,P2,... each in [0, 1]")
    return rates


def _check_eplb(dep: Deployment) -> None:
    """vLLM's rules for its expert-parallel load balancer (vllm/config/parallel.py ParallelConfig)."""
    _at_least("num_redundant_experts", dep.num_redundant_experts, 0)
    if not dep.enable_eplb:
        if dep.num_redundant_experts:
            raise ValueError(f"num_redundant_experts is set to {dep.num_redundant_experts} but EPLB is not enabled: "
                             f"give --enable-eplb or leave num_redundant_experts at 0")
        return
    if not dep.enable_expert_parallel:
        raise ValueError("enable_expert_parallel must be True to use EPLB (--enable-eplb needs "
                         "--enable-expert-parallel)")
    if dep.tp * dep.dp <= 1:
        raise ValueError(f"EPLB requires tensor_parallel_size or data_parallel_size to be greater than 1, but got "
                         f"TP={dep.tp}, DP={dep.dp}")


def _check_lora(dep: Deployment) -> None:
    """vLLM's LoRAConfig checks (vllm/config/lora.py: max_loras >= 1, the rank one of MaxLoRARanks), and the
    settings that need --enable-lora (vLLM ignores them without it; here a typo'd line is told)."""
    _at_least("max_loras", dep.max_loras, 1)
    _one_of("max_lora_rank", dep.max_lora_rank, LORA_RANKS)
    if not dep.enable_lora:
        for name in ("max_loras", "max_lora_rank"):
            if getattr(dep, name) != getattr(Deployment, name):
                raise ValueError(f"{name} is a LoRA setting: give --enable-lora too")
        return
    if not dep.vllm_v1:
        raise ValueError("LoRA adapters are served by vLLM v1's scheduler (--policy vllm-v1): the paper's vLLM "
                         "v0.2.0 had no LoRA")


def _check_offloading(dep: Deployment) -> None:
    """vLLM's --cpu-offload-gb, --kv-offloading-size and --kv-offloading-backend (vllm/config/cache.py), and
    what the CPU KV tier here needs: vLLM v1's scheduler with its prefix cache."""
    if dep.kv_offloading_backend != "native":
        raise ValueError(f"kv_offloading_backend {dep.kv_offloading_backend!r} is not modelled: only vLLM's "
                         f"native CPU offloading is (LMCache keeps its cache in a server of its own)")
    if not 0 <= dep.cpu_offload_gb < math.inf:
        raise ValueError(f"cpu_offload_gb must be a number of GiB >= 0, got {dep.cpu_offload_gb}")
    size = dep.kv_offloading_size
    if size is None:
        return
    if not 0 < size < math.inf:
        raise ValueError(f"kv_offloading_size must be a positive number of GiB, got {size}")
    if not dep.vllm_v1:
        raise ValueError("KV offloading (--kv-offloading-size) is vLLM v1's (--policy vllm-v1): the paper's vLLM "
                         "v0.2.0 had none")
    if not dep.prefix_caching_on:
        raise ValueError("KV offloading here stores prefix-cache blocks: it needs prefix caching on (drop "
                         "--no-enable-prefix-caching)")


def _check_dbo(dep: Deployment) -> None:
    """vLLM's rule for dual-batch overlap (vllm/config/vllm.py VllmConfig.__post_init__), and thresholds a step
    can reach."""
    _at_least("dbo_decode_token_threshold", dep.dbo_decode_token_threshold, 1)
    _at_least("dbo_prefill_token_threshold", dep.dbo_prefill_token_threshold, 1)
    if dep.enable_dbo and dep.all2all_backend not in ALL2ALL_BACKENDS[1:]:
        raise ValueError(f"Microbatching (--enable-dbo) currently only supports the deepep_low_latency and "
                         f"deepep_high_throughput all2all backends, not {dep.all2all_backend}: give "
                         f"--all2all-backend deepep_low_latency or deepep_high_throughput")


# What a value of each kind must be, said and tested. A bool is an int to Python, so it is refused where a number
# is meant (tp=True); an int setting refuses 16.0 and 1.5 as vLLM's argparse does.
_KINDS = {bool: ("a bool (True or False)", lambda v: isinstance(v, bool)),
          int: ("an integer", lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool)),
          float: ("a number", lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool)),
          str: ("a string", lambda v: isinstance(v, str))}


def check_type(name: str, value, kind: type, optional: bool = False) -> None:
    """A one-line ValueError naming `name` unless `value` is of `kind` (bool, int, float or str; or None where
    `optional`): the Python API refuses '2' for an integer or 'no' for a bool here, not with a TypeError from
    deep inside a run (or, for 'no', by taking it as true)."""
    what, ok = _KINDS[kind]
    if not (ok(value) or optional and value is None):
        raise ValueError(f"{name} must be {what}{' or None' if optional else ''}, got {value!r} "
                         f"({type(value).__name__})")


def _one_of(what: str, value, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{what} {value!r} is not supported; choose one of {', '.join(map(str, choices))}")


def _at_least(name: str, value, low: float) -> None:
    if value is not None and not value >= low:       # (NaN too)
        raise ValueError(f"{name} must be >= {low}, got {value}")
