"""How GPU memory splits into weights, activations and KV cache (the number of KV blocks).

This is the arithmetic vLLM does at start-up, done ahead of time. Of the
memory torch reports for each GPU, `gpu_memory_utilization` may be used; out
of that come the weights (this GPU's tensor-parallel shard, plus the rotary
cos/sin cache vLLM keeps beside them), the peak activation of vLLM's profile
run (a forward pass of `max_num_batched_tokens` tokens, then the sampler's
warm-up over `max_num_seqs` rows: the larger of the two), and non-torch memory
(CUDA context growth, cuBLAS workspaces; the collectives' buffers under TP).
What is left is cut into KV blocks. Every GPU holds its share of the heads of
the same block ids, so the number of blocks is a per-GPU figure and the token
slots are blocks x block_size.

Checks: vLLM 0.19.0's start-up logs on an H100 80GB, 39 runs of 17 models (TP 1-4,
PP 2 and 4, bf16/fp16/fp32, FP8 weights and KV; bench/bench_memory_vllm_logs.py):
the KV cache within 0.4 % on average, 4.7 % at worst (Qwen2.5-72B at TP 2, whose
3 GiB of KV cache make 0.14 GiB count); the sampler's bytes per logit and the
non-torch memory at TP 1, 2 and 4 come from those logs, the rest is not fitted. vLLM 0.19
on one RTX 4090 (torch reports 25,250,627,584 bytes), Llama-3.1-8B bf16,
utilization 0.9, 2048 batched tokens allocated 41,408 KV tokens; the plan gives
8 % more (0.40 GiB the H100 logs do not explain). The PagedAttention paper's
Table 1 (its "GB" are GiB: 15.7K slots x 800 KiB = 12 GiB): OPT-13B on
1xA100-40GB ~12 GiB, OPT-66B on 4xA100-40GB ~21 GiB, OPT-175B on 8xA100-80GB
~264 GiB; the plan is within 10 %. Tests: tests/test_memory.py, test_measured.py.

Quantized deployments (`weight_format`, planner/catalog/quantization.py): the
blocks' linear layers take the format's bytes with its scales, the embedding,
LM head, norms and biases stay 16-bit; activations stay 16-bit too (vLLM's
quantized GEMMs take and return 16-bit activations). An FP8 KV cache
(`kv_dtype_bytes=1`) stores one byte per element (the per-layer k/v scales are
two floats), so a block costs half of a 16-bit one and the same memory holds
twice the blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.config import DEFAULT_MAX_NUM_BATCHED_TOKENS
from engine.deployment import ALL2ALL_BACKENDS
from planner.catalog import GIB, GpuSpec, ModelSpec, resolve_gpu, resolve_model
from planner.catalog.deepseek_v4 import COMPRESSED_BLOCK
from planner.catalog.quantization import WeightFormat
from planner.cost.all2all import LL_CHUNK_TOKENS
from planner.cost.moe import MoeParallel
from planner.cost.sparse import as_cached_on
from planner.deploy.parallel import largest_stage
from planner.deploy.state_cache import block_layers, cache_block_size, state_blocks
from planner.errors import PlannerError

# vLLM 0.1-era scheduler limits (the token budget's from the engine core), used
# as defaults so the activation estimate matches the profile run vLLM would do.
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_SWAP_SPACE_BYTES = 4 * GIB     # vLLM's default CPU swap space per GPU

# vLLM warms the sampler up over max_num_seqs rows of the whole vocabulary (top-k and top-p on) after the
# forward pass. Bytes alive per logit at its peak, measured: vLLM 0.19's "torch peak memory increase" on one
# H100 over nine dense models whose sampler dominates (vocabularies of 100k-256k at 1,024 sequences; logs of
# jgchn/llm-d-planner@56dc5b7, branch accuracy) less the forward's output held meanwhile comes to 14.7-15.1
# bytes: the 16-bit logits, their fp32 copy, the probabilities and the sampling noise (14), and some scratch.
_SAMPLER_BYTES_PER_LOGIT = 14.8
# vLLM's VLLM_FUSED_MOE_CHUNK_SIZE default: the tokens its fused MoE runs at a time (vllm/envs.py)
FUSED_MOE_CHUNK_TOKENS = 16 * 1024

# Memory outside torch's allocator that grows while vLLM profiles (its "non-torch forward increase memory"):
# on one GPU the CUDA context's growth and cuBLAS workspaces, 0.24-0.27 GiB in vLLM 0.19's logs on an H100
# (the same 39 runs; 0.16-0.20 GiB in vllm-project/vllm#12126 and #14447 on older versions).
NON_TORCH_BYTES = int(0.25 * GIB)
# Under tensor parallelism the collectives' buffers join it, mostly NCCL's: a few MiB per channel per peer
# and protocol, in each of the communicators vLLM opens, and more channels the richer the links. On H100s
# (NVLink 4 through NVSwitch) vLLM 0.19 logs 2.06-2.10 GiB of non-torch memory in all at TP 2 and 2.13-2.21
# at TP 4 (13 runs, 7 models; 3.58 GiB at TP 2 on vllm-project/vllm#10511's H100 in late 2024; other public
# logs: 1.38 on an H200 at TP 2, 1.63 on a B300 at TP 4); NVLink 4 and 5 GPUs take those. Over PCIe the logs
# show none beyond one GPU's: 0.17-0.36 GiB in all on 8 L40S, 0.25 on two RTX 4090s (#13061), 0.20 on 16
# RTX 3090s (#14447), 0.09 on four A30s (#29070). On A100s (NVLink 3) they disagree (about 0.1 GiB at TP 2
# with vLLM 0.10.1, dennislee22/vLLM-benchmarking; 2.1 at TP 8 with 0.7): those keep the NCCL buffers NVIDIA's
# aiconfigurator-core spec sheets use (systems/*.yaml, misc.nccl_mem). TP 8 as TP 4 (no 0.19 log of it).
NVSWITCH_COLLECTIVE_BYTES = {2: int(1.83 * GIB), 4: int(1.92 * GIB)}
NCCL_COLLECTIVE_BYTES = {2: 358_612_992, 4: 411_041_792}
NVSWITCH_LINKS = ("nvlink4", "nvlink5")


def activation_reserve_bytes(model: ModelSpec, tp: int = 1, dtype_bytes: int = 2,
                             max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
                             max_num_seqs: int = DEFAULT_MAX_NUM_SEQS, dp: int = 1,
                             expert_parallel: bool = False, all2all: str = ALL2ALL_BACKENDS[0]) -> int:
    """Peak activation memory per GPU of vLLM's profile run: a forward pass of max_num_batched_tokens tokens,
    then the sampler's warm-up.

    The forward's peak is what is alive inside one layer, per token: the residual stream and the normed input
    (2*hidden, replicated), the QKV projection and the attention output (this GPU's heads), and the MLP's
    up-projection output plus its activated copy (gate and up for a gated MLP). Layers run one after another,
    so one layer's worth is the peak. The layers' buffers are free when the sampler runs over min(max_num_seqs,
    tokens) rows of the whole vocabulary (`_SAMPLER_BYTES_PER_LOGIT`) beside the forward's output: the peak is
    the larger of the two phases, not their sum (vLLM 0.19's logs on an H100: 1.89 GiB for Llama-3.1-8B at TP
    1, 2 and 4 alike, the sampler's). Allocator slack is covered by the utilization margin.

    A MoE layer instead holds the hidden states and router logits of every token the dp replicas gather
    into it, and vLLM's fused-MoE caches: top-k rows of the gate/up output, of its activation and of the
    experts' outputs, each expert's width split over tp x dp GPUs (whole under expert parallelism). The
    fused MoE runs at most VLLM_FUSED_MOE_CHUNK_SIZE (16,384) tokens at a time, so its caches hold that
    many. They stay allocated while the sampler runs (vLLM 0.19's logs on an H100: Qwen3-30B-A3B 2.68 GiB,
    DeepSeek-V2-Lite 1.93, Mixtral-8x7B at TP 2 1.21, each 0.3-0.7 GiB above its sampler alone). DeepEP's
    backends (`all2all`, expert parallelism with dp > 1) gather nothing: a rank keeps its own tokens, and its
    experts see the (token, expert) pairs routed to them: under the high-throughput kernels as many as its
    own tokens send (top-k each, uniform routing), under the low-latency kernels the masked buffer of its
    local experts x 256 tokens from each of the EP ranks (vLLM's VLLM_MOE_DP_CHUNK_SIZE), allocated whole.
    """
    h, i = model.hidden_size, model.intermediate_size
    mlp = (3 * i // tp) if model.gated_mlp else (2 * i // tp)
    # the widest kind of attention layer (Gemma 4's full layers have heads twice as wide)
    attention = max(2 * spec.q_size // tp + spec.kv_cache_width(tp) for _, spec in model.attention_kinds)
    per_token = 2 * h + attention + mlp
    tokens = max_num_batched_tokens
    sampled_rows = min(max_num_seqs, tokens)
    forward = tokens * per_token * dtype_bytes
    sampler = int(sampled_rows * model.vocab_size * _SAMPLER_BYTES_PER_LOGIT) + tokens * h * dtype_bytes
    if not model.is_moe:
        return max(forward, sampler)
    width = model.moe_intermediate_size // (1 if expert_parallel else tp * dp)
    k = model.num_experts_per_tok
    gathered, pairs = tokens * dp, min(tokens * dp, FUSED_MOE_CHUNK_TOKENS) * k
    par = MoeParallel(tp=tp, dp=dp, expert_parallel=expert_parallel, all2all=all2all)
    if par.deepep and all2all == "deepep_high_throughput":
        gathered, pairs = tokens, min(tokens, FUSED_MOE_CHUNK_TOKENS) * k
    elif par.deepep:                    # the low-latency kernels' masked buffer, allocated whole
        local_experts = -(-model.num_experts // par.gpus)
        gathered, pairs = tokens, local_experts * LL_CHUNK_TOKENS * par.gpus
    moe = (gathered * (2 * h + model.num_experts) + pairs * (3 * width + h)) * dtype_bytes
    return max(forward, moe + sampler)


def non_torch_bytes(tp: int = 1, interconnect: str = NVSWITCH_LINKS[0]) -> int:
    """Per-GPU memory outside torch's allocator: CUDA/cuBLAS growth, plus the collectives' buffers under TP by
    the GPUs' links (`interconnect`, the catalog's: "nvlink4", "nvlink3", "pcie4", ...)."""
    if tp == 1 or interconnect.startswith("pcie"):
        return NON_TORCH_BYTES
    table = NVSWITCH_COLLECTIVE_BYTES if interconnect in NVSWITCH_LINKS else NCCL_COLLECTIVE_BYTES
    return NON_TORCH_BYTES + table.get(tp, table[4])


def rotary_cache_bytes(model: ModelSpec, dtype_bytes: int = 2) -> int:
    """vLLM's precomputed rotary cos/sin table, [max_position, rotary dims], held beside the weights: one per
    shape of head (Gemma 4's full layers rotate their own, wider heads)."""
    return model.max_position_embeddings * sum(spec.rotary_dims for _, spec in model.attention_kinds) * dtype_bytes


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Per-GPU memory budget and the KV cache it leaves. Bytes unless named otherwise."""

    model: str
    gpu: str
    tp: int
    gpu_memory_utilization: float
    block_size: int
    dtype_bytes: int
    gpu_memory_bytes: int           # one GPU's memory, as torch reports it
    usable_bytes_per_gpu: int       # utilization x memory
    weight_bytes_per_gpu: int       # the weights' shard plus the rotary cache
    activation_bytes_per_gpu: int
    non_torch_bytes_per_gpu: int    # CUDA context growth, cuBLAS workspaces, NCCL buffers
    kv_bytes_per_token: int         # the whole model's K and V for one token (all layers, all heads)
    block_bytes_per_gpu: int        # one block's K and V on one GPU (its share of the heads)
    num_gpu_blocks: int
    num_cpu_blocks: int             # swap space, in blocks
    quantization: str | None = None  # the weights' format (None: 16-bit), as WeightFormat.describe() says
    kv_dtype_bytes: int = 2         # bytes per KV-cache element (1: FP8)
    dp: int = 1                     # data-parallel replicas: each holds this plan's KV cache of its own
    expert_parallel: bool = False
    expert_bytes_per_gpu: int = 0   # the MoE experts' share of weight_bytes_per_gpu
    sliding_window_bytes_per_gpu: int = 0   # set aside for the sliding-window layers' blocks (gpt-oss)
    state_blocks_per_seq: int = 0   # blocks a running sequence holds for its recurrent states (Qwen3.5)
    window_blocks_per_seq: int = 0  # blocks a running sequence holds for its sliding layers' windows (vLLM v1)
    redundant_experts: int = 0      # EPLB's extra expert copies over the EP ranks (their weights are counted)
    pp: int = 1                     # pipeline stages, tp GPUs each: this plan is the largest stage's
    lora_bytes_per_gpu: int = 0     # --enable-lora's adapter slots (in weight_bytes_per_gpu)
    cpu_offload_bytes_per_gpu: int = 0   # --cpu-offload-gb: the weights kept in host memory (not in weight_bytes)

    @property
    def kv_bytes_per_gpu(self) -> int:
        return self.num_gpu_blocks * self.block_bytes_per_gpu

    @property
    def kv_bytes_total(self) -> int:
        """KV cache across all tensor-parallel GPUs (the paper's Table 1 figure), and its pipeline stages."""
        return self.kv_bytes_per_gpu * self.tp * self.pp

    @property
    def kv_token_slots(self) -> int:
        return self.num_gpu_blocks * self.block_size

    @property
    def kv_head_share(self) -> int:
        """Over how many GPUs a token's KV is split: tp for heads split evenly, fewer when tp exceeds the KV
        heads (each GPU holds one), 1 for MLA's latent (whole on every GPU). Read from the bytes themselves."""
        whole = self.kv_bytes_per_token * self.block_size
        return max(1, min(self.tp, round(whole / self.block_bytes_per_gpu))) if self.block_bytes_per_gpu else 1

    def summary(self) -> dict[str, float | int | str]:
        """Flat, JSON-ready view for reports and `planner capacity`; sizes also in GiB."""
        return {
            "model": self.model,
            "gpu": self.gpu,
            "tp": self.tp,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "block_size": self.block_size,
            "dtype_bytes": self.dtype_bytes,
            "kv_dtype_bytes": self.kv_dtype_bytes,
            "gpu_memory_gib": self.gpu_memory_bytes / GIB,
            "usable_gib_per_gpu": self.usable_bytes_per_gpu / GIB,
            "weights_gib_per_gpu": self.weight_bytes_per_gpu / GIB,
            "activations_gib_per_gpu": self.activation_bytes_per_gpu / GIB,
            "non_torch_gib_per_gpu": self.non_torch_bytes_per_gpu / GIB,
            "kv_gib_per_gpu": self.kv_bytes_per_gpu / GIB,
            "kv_gib_total": self.kv_bytes_total / GIB,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "num_gpu_blocks": self.num_gpu_blocks,
            "num_cpu_blocks": self.num_cpu_blocks,
            "kv_token_slots": self.kv_token_slots,
            "kv_head_share": self.kv_head_share,
            **({"quantization": self.quantization} if self.quantization is not None else {}),
            **({"dp": self.dp} if self.dp != 1 else {}),
            **({"pp": self.pp} if self.pp != 1 else {}),
            **({"expert_parallel": self.expert_parallel, "experts_gib_per_gpu": self.expert_bytes_per_gpu / GIB}
               if self.expert_bytes_per_gpu else {}),
            **({"sliding_window_gib_per_gpu": self.sliding_window_bytes_per_gpu / GIB}
               if self.sliding_window_bytes_per_gpu else {}),
            **({"window_blocks_per_seq": self.window_blocks_per_seq} if self.window_blocks_per_seq else {}),
            **({"redundant_experts": self.redundant_experts} if self.redundant_experts else {}),
            **({"lora_gib_per_gpu": self.lora_bytes_per_gpu / GIB} if self.lora_bytes_per_gpu else {}),
            **({"cpu_offload_gib_per_gpu": self.cpu_offload_bytes_per_gpu / GIB}
               if self.cpu_offload_bytes_per_gpu else {}),
            **({"state_blocks_per_seq": self.state_blocks_per_seq,
                "state_mib_per_seq_per_gpu": self.state_blocks_per_seq * self.block_bytes_per_gpu / 2**20}
               if self.state_blocks_per_seq else {}),
        }


def _check_args(gpu_memory_utilization: float, block_size: int, dtype_bytes: int, kv_dtype_bytes: int,
                max_num_batched_tokens: int, max_num_seqs: int, swap_space_bytes: int) -> None:
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise PlannerError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if block_size < 1:
        raise PlannerError(f"block_size must be >= 1, got {block_size}")
    if dtype_bytes not in (1, 2, 4) or kv_dtype_bytes not in (1, 2, 4):
        raise PlannerError(f"dtype_bytes and kv_dtype_bytes must be 1, 2 or 4, got {dtype_bytes} and {kv_dtype_bytes}")
    if max_num_batched_tokens < 1 or max_num_seqs < 1:
        raise PlannerError(f"max_num_batched_tokens and max_num_seqs must be >= 1, "
                           f"got {max_num_batched_tokens} and {max_num_seqs}")
    if swap_space_bytes < 0:
        raise PlannerError(f"swap_space_bytes must be >= 0, got {swap_space_bytes}")


def _check_kv_memory(kv_bytes: int, gpu: GpuSpec, held: int) -> None:
    """vLLM allocates the cache it is given without measuring what is free: a cache beside the weights and
    non-torch memory larger than the GPU fails to allocate at start-up."""
    if held + kv_bytes > gpu.memory_bytes:
        raise PlannerError(f"--kv-cache-memory-bytes {kv_bytes:,} ({kv_bytes / GIB:.2f} GiB) does not fit on "
                           f"{gpu.name} beside {held / GIB:.2f} GiB of weights and non-torch memory per GPU "
                           f"({gpu.memory_bytes / GIB:.2f} GiB in all): vLLM would fail to allocate it")


def kv_block_layout(model: ModelSpec, tp: int, kv_dtype_bytes: int, block_size: int,
                    max_num_seqs: int, kv_room: int | None = None) -> tuple[int, int]:
    """(bytes of one KV block on one GPU, bytes set aside for the sliding-window layers).

    A block holds the full-attention layers' K and V: only they grow with the context. vLLM's
    hybrid KV cache manager gives the sliding-window layers blocks from the same pool but frees
    those that leave the window, so a running request holds at most cdiv(window - 1, block_size)
    + 1 of them; the plan sets that many aside for each of max_num_seqs requests (what a full
    batch holds: gpt-oss's 128-token window) and cuts the rest into blocks of the full-attention
    layers. When that reserve would not fit in `kv_room` at all (the memory left for the KV cache;
    Gemma 3's 1,024-token windows at vLLM's 1,024 sequences need hundreds of GB), a full batch of
    sequences past their windows could never be resident: the sliding layers' K and V are then held
    in every block like the full layers' (exact for a sequence within its window, conservative past
    it). Every plan the reserve can hold keeps it. Gemma 4's full layers cache their own, wider heads
    (ModelSpec.full_layer_spec), so its blocks and its reserve are sized each at their layers' shape.

    A Gated DeltaNet hybrid's block spans its attention groups' layers (planner/deploy/state_cache.py:
    vLLM pads each group to the same layer count); its sequences' states are blocks of the same pool,
    taken as they run (`state_blocks`), so nothing is set aside. So is DeepSeek-V4's window and compressor
    state, beside its blocks of compressed rows (planner/catalog/deepseek_v4.py).
    """
    ca = model.compressed_attention
    if ca is not None:
        return ca.block_bytes(model.head_size, model.rotary_dims) * block_size // COMPRESSED_BLOCK, 0
    per_layer_block = model.kv_cache_bytes(tp, kv_dtype_bytes) * block_size
    if model.linear_attention is not None:
        return block_layers(model) * per_layer_block, 0
    full = (model.full_attention_layers * model.full_layer_spec.kv_cache_bytes(tp, kv_dtype_bytes)
            - model.uncached_index_key_bytes) * block_size
    sliding = 0
    if model.sliding_layers:
        blocks = -(-(model.window - 1) // block_size) + 1
        sliding = max_num_seqs * blocks * model.sliding_layers * per_layer_block
        if kv_room is not None and sliding >= kv_room:
            return full + model.sliding_layers * per_layer_block, 0
    return full, sliding


def draft_weight_bytes(draft: ModelSpec, tp: int, dtype_bytes: int, shares_vocab: bool) -> int:
    """What a speculative proposer adds to each GPU's weights: a draft model's 16-bit weights and rotary
    table, or for a head that shares the target's vocabulary (EAGLE, MTP) its layer alone: the
    embedding and LM head are the target's (vocab-parallel, 1/tp each), and so is the rotary table
    (vLLM's get_rope hands out one cached table per set of parameters)."""
    weights = draft.weight_bytes_per_gpu(tp, dtype_bytes)
    if shares_vocab:
        return weights - -(-(draft.embedding_params + draft.lm_head_params) // tp) * dtype_bytes
    return weights + rotary_cache_bytes(draft, dtype_bytes)


def plan_memory(model: ModelSpec | str, gpu: GpuSpec | str, tp: int = 1,
                gpu_memory_utilization: float = 0.9, block_size: int = 16, dtype_bytes: int = 2,
                max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
                max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
                swap_space_bytes: int = DEFAULT_SWAP_SPACE_BYTES, count_non_torch: bool = True,
                weight_format: WeightFormat | None = None, kv_dtype_bytes: int | None = None,
                dp: int = 1, expert_parallel: bool = False, draft: ModelSpec | None = None,
                draft_shares_vocab: bool = False, pp: int = 1, all2all: str = ALL2ALL_BACKENDS[0],
                shared_windows: bool = False, redundant_experts: int = 0,
                kv_cache_memory_bytes: int | None = None, lora_bytes: int = 0,
                cpu_offload_bytes: int = 0) -> MemoryPlan:
    """Split each of `tp` GPUs' memory into weights, activations and KV blocks.

    `count_non_torch=False` reproduces vLLM 0.1 (the paper's engine), whose
    profiler saw only torch's own allocations. `weight_format` stores the
    linear layers quantized; `kv_dtype_bytes` (default `dtype_bytes`) sizes the
    KV cache's elements (1 for FP8). `dp` data-parallel replicas of `tp` GPUs share a MoE's experts
    (split by width, or whole with `expert_parallel`); each replica has its own KV cache. A `draft` model
    (speculative decoding) holds its 16-bit weights beside the target's and its KV in the same blocks,
    as vLLM's draft model shares the target's block tables: a block holds both models' KV. An EAGLE or
    MTP head (`draft_shares_vocab`) reads the target's embedding, LM head and rotary table: only its
    layer is added. With `pp` pipeline stages each GPU holds its stage's layers: the plan is the largest
    stage's, its share of the layers' weights and KV per block (vLLM sizes one cache for every stage, by
    the stage that fits the fewest blocks); the embedding and LM head count in that share too.
    `shared_windows` (vLLM v1's hybrid KV cache manager): a running sequence takes its sliding layers' window
    blocks from the same pool as it runs, so what kv_block_layout would set aside for a full batch's windows
    is instead that many blocks per running sequence (`window_blocks_per_seq`): at vLLM's 1,024 sequences,
    gpt-oss-120b on one H100 was left 18,160 tokens for its full layers where vLLM holds them as it goes.
    `kv_cache_memory_bytes` (vLLM's --kv-cache-memory-bytes) is the KV cache's room itself, whatever the
    utilization leaves; the plan refuses it when the weights and non-torch memory leave less of the GPU.
    `lora_bytes` is what --enable-lora's adapter slots hold on each GPU (planner/cost/lora.py), counted with
    the weights: vLLM allocates them with the model, before it measures what is left for the cache.
    `cpu_offload_bytes` is vLLM's --cpu-offload-gb in bytes: that much of each GPU's layers stays in host
    memory (`offloaded_weight_bytes`), and the GPU holds the rest.
    """
    model, gpu = resolve_model(model), resolve_gpu(gpu)
    kv_dtype_bytes = dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
    _check_args(gpu_memory_utilization, block_size, dtype_bytes, kv_dtype_bytes, max_num_batched_tokens,
                max_num_seqs, swap_space_bytes)
    model.kv_heads_per_gpu(tp)                  # validates tp against the head counts first
    model = as_cached_on(model, gpu, kv_dtype_bytes)       # a DSA model's FP8 latent in the GPU's layout
    block_size = cache_block_size(model, gpu, tp, dtype_bytes, kv_dtype_bytes, block_size)   # as vLLM raises it
    usable = int(gpu.memory_bytes * gpu_memory_utilization)
    weights = (model.weight_bytes_per_gpu(tp, dtype_bytes, weight_format, dp, expert_parallel, redundant_experts)
               + rotary_cache_bytes(model, dtype_bytes) + lora_bytes)
    activations = activation_reserve_bytes(model, tp, dtype_bytes, max_num_batched_tokens, max_num_seqs, dp,
                                           expert_parallel, all2all)
    group = tp * dp if model.is_moe else tp      # a MoE's collectives span every GPU of the deployment
    non_torch = non_torch_bytes(group, gpu.interconnect) if gpu.kind == "gpu" and count_non_torch else 0
    stage = largest_stage(model.num_layers, pp)             # the largest stage's layers (all with pp = 1)
    weights = weights * stage // model.num_layers
    offloaded = offloaded_weight_bytes(model, tp, dtype_bytes, weight_format, dp, expert_parallel, redundant_experts,
                                       pp, cpu_offload_bytes)
    weights -= offloaded
    if draft is not None:
        weights += draft_weight_bytes(draft, tp, dtype_bytes, draft_shares_vocab)
    kv_room = usable - weights - activations - non_torch
    if kv_cache_memory_bytes is not None:
        _check_kv_memory(kv_cache_memory_bytes, gpu, weights + non_torch)
        kv_room = kv_cache_memory_bytes
    block_bytes, sliding = kv_block_layout(model, tp, kv_dtype_bytes, block_size, max_num_seqs, kv_room)
    block_bytes = -(-block_bytes * stage // model.num_layers)
    if draft is not None:
        draft_block, draft_sliding = kv_block_layout(draft, tp, kv_dtype_bytes, block_size, max_num_seqs, kv_room)
        block_bytes, sliding = block_bytes + draft_block, sliding + draft_sliding
    window_blocks = 0
    if shared_windows and sliding:          # one sequence's windows, in blocks of the pool, taken as it runs
        window_blocks, sliding = -(-sliding // (max_num_seqs * block_bytes)), 0
    num_blocks = (kv_room - sliding) // block_bytes
    if num_blocks < 1 and kv_cache_memory_bytes is not None:
        raise PlannerError(f"--kv-cache-memory-bytes {kv_cache_memory_bytes:,} holds no KV block of {model.name} "
                           f"on {tp} x {gpu.name}: one takes {(block_bytes + sliding) / 2**20:,.2f} MiB per GPU")
    if num_blocks < 1:
        need = (weights + activations + non_torch + block_bytes) / GIB
        raise PlannerError(f"model {model.name} does not fit on {tp} x {gpu.name} at utilization "
                           f"{gpu_memory_utilization} with {max_num_batched_tokens} batched tokens: needs "
                           f"{need:.1f} GiB per GPU (weights {weights / GIB:.1f}, activations "
                           f"{activations / GIB:.1f}), {usable / GIB:.1f} GiB usable"
                           + ("; fewer batched tokens (--max-model-len, --chunked-prefill) shrink the activations"
                              if activations > usable // 8 else ""))
    return MemoryPlan(
        model=model.name, gpu=gpu.name, tp=tp, gpu_memory_utilization=gpu_memory_utilization,
        block_size=block_size, dtype_bytes=dtype_bytes, gpu_memory_bytes=gpu.memory_bytes,
        usable_bytes_per_gpu=usable, weight_bytes_per_gpu=weights, activation_bytes_per_gpu=activations,
        non_torch_bytes_per_gpu=non_torch,
        kv_bytes_per_token=model.kv_bytes_per_token(kv_dtype_bytes), block_bytes_per_gpu=block_bytes,
        num_gpu_blocks=num_blocks, num_cpu_blocks=swap_space_bytes // block_bytes,
        quantization=weight_format.describe() if weight_format is not None else None, kv_dtype_bytes=kv_dtype_bytes,
        dp=dp, expert_parallel=expert_parallel, sliding_window_bytes_per_gpu=sliding,
        state_blocks_per_seq=state_blocks(model), window_blocks_per_seq=window_blocks, pp=pp,
        expert_bytes_per_gpu=model.expert_bytes_per_gpu(tp, dp, expert_parallel, dtype_bytes, weight_format,
                                                        redundant_experts),
        redundant_experts=redundant_experts, lora_bytes_per_gpu=lora_bytes * stage // model.num_layers,
        cpu_offload_bytes_per_gpu=offloaded,
    )


def offloaded_weight_bytes(model: ModelSpec, tp: int, dtype_bytes: int, weight_format: WeightFormat | None,
                           dp: int, expert_parallel: bool, redundant_experts: int, pp: int, cap: int) -> int:
    """What vLLM's --cpu-offload-gb keeps in host memory on each GPU: its decoder layers' parameters, the first
    layer's first, up to `cap` bytes, never the embedding or the LM head (vLLM's UVA offloader wraps each layer
    as it builds it and stops at the parameter that reaches the cap; that parameter's bytes past it, at most
    one matrix, are not counted here)."""
    if not cap:
        return 0
    whole = model.weight_bytes_per_gpu(tp, dtype_bytes, weight_format, dp, expert_parallel, redundant_experts)
    layers = whole - -(-(model.embedding_params + model.lm_head_params) // tp) * dtype_bytes
    return min(cap, layers * largest_stage(model.num_layers, pp) // model.num_layers)
