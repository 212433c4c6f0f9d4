"""Data and expert parallelism of a deployment (vLLM's --data-parallel-size and --enable-expert-parallel).

vLLM lays a MoE's expert layers over all tp x dp GPUs of a deployment (FusedMoEParallelConfig):
without expert parallelism every GPU holds every expert with 1/(tp x dp) of its width (the MoE's
tensor parallel size is tp x dp); with it each GPU holds whole experts, E / (tp x dp) of them
(EP = tp x dp, the experts' width unsplit). Attention stays per replica: dp copies of a tp-way
sharded attention, each with its own scheduler and KV cache. A dense model's dp replicas share
nothing (vLLM runs them as independent engines behind its DP coordinator).

Refused here, in one line each, as vLLM would refuse or could not load them:
- expert parallelism on a model without experts ("--enable-expert-parallel" has nothing to split);
- more EP ranks than experts (a GPU would hold no expert; vLLM's expert map gives each rank
  E // EP experts, zero here);
- without expert parallelism, an expert width that tp x dp does not divide (the weight loader
  narrows each expert's gate/up rows and down columns into tp x dp equal shards).
Uneven expert counts under EP (128 experts over 6 GPUs) are what vLLM runs (the first E % EP ranks get
one more); the plan holds the most loaded GPU's experts and warns.

A checkpoint stored in 128 x 128 FP8 blocks (DeepSeek's, Qwen's and MiniMax's FP8 releases) loads only
where every shard holds whole blocks. vLLM checks it as it creates the weights: the experts' gate/up rows
(and, split over more than one GPU, the down projection's columns) on each GPU must be a multiple of the
block (vllm/model_executor/layers/quantization/fp8.py, Fp8MoEMethod.create_weights: "The output_size of
gate's and up's weight = 192 is not divisible by weight quantization block_n = 128"), and likewise a
dense MLP's or the shared experts' width per tensor-parallel rank, which their down projection splits
(validate_fp8_block_shape in quantization/utils/fp8_utils.py; a merged gate/up projection's own
partitions may miss the block since vLLM's MiMo-V2-Flash support, `_maybe_allow_fp8_block_shape_mismatch`
in layers/linear.py, so one unsplit GPU is never refused). So Qwen3-235B-A22B-FP8 (expert width 1536)
runs at TP 4, or at TP 8 only with --enable-expert-parallel (whole experts per GPU), and
Qwen3-30B-A3B-FP8 (768) at TP 2, or TP 4 with EP. The attention projections are whole heads of 128 (or
MLA's) in every such release and are not checked. vLLM's online `--quantization fp8` scales per tensor
and has no blocks. On Blackwell (B200), vLLM since September 2026 loads such expert shards with
FlashInfer's TRTLLM MoE, padded to whole blocks, under pure tensor parallelism (vllm#55867): there the
plan warns instead, and prices the unpadded share. A validation replaying a run that did load
(`refuse=False`) is not checked.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.deployment import Deployment
from planner.catalog import SM100_FAMILIES, GpuSpec, ModelSpec
from planner.catalog.quantization import FP8_BLOCK, WeightFormat
from planner.cost.moe import MoeParallel
from planner.cost.nodes import NODE_GPUS, node_link, nodes_of
from planner.errors import PlannerError

# GPUs where vLLM's FlashInfer TRTLLM MoE (Blackwell's SM100 kernels) pads a block-FP8 expert shard to whole
# blocks instead of refusing it, under pure tensor parallelism (vllm#55867, fp8.py: "FP8 TRTLLM TP loading uses
# complete checkpoint blocks"; it refuses otherwise: "global expert dimensions, pure TP, and no LoRA or expert
# bias")
PADDED_FP8_MOE = SM100_FAMILIES


@dataclass(frozen=True, slots=True)
class MoeLayout:
    """How one MoE layer's experts lie over the deployment's GPUs."""

    gpus: int                # tp x dp: every GPU of the deployment runs every MoE layer
    ep: int                  # expert-parallel size (1: experts split by width)
    moe_tp: int              # the experts' width split (1 under expert parallelism)
    experts_per_gpu: int     # experts on the most loaded GPU
    width_per_gpu: int       # each local expert's intermediate width on one GPU

    def describe(self) -> str:
        if self.gpus == 1:
            return "1 GPU holds every expert"
        how = (f"EP{self.ep}: {self.experts_per_gpu} whole experts per GPU" if self.ep > 1
               else f"each expert's width split {self.moe_tp} ways ({self.width_per_gpu} per GPU)")
        return f"{self.gpus} GPUs, {how}"


def moe_layout(model: ModelSpec, deployment: Deployment) -> MoeLayout | None:
    """The experts' layout of `deployment` (None for a dense model), after checking it as vLLM would."""
    check_parallel(model, deployment)
    if not model.is_moe:
        return None
    gpus = deployment.tp * deployment.dp
    if deployment.enable_expert_parallel:
        return MoeLayout(gpus, gpus, 1, -(-model.num_experts // gpus), model.moe_intermediate_size)
    return MoeLayout(gpus, 1, gpus, model.num_experts, model.moe_intermediate_size // gpus)


def check_parallel(model: ModelSpec, deployment: Deployment) -> None:
    """Raise a one-line PlannerError for a dp / expert-parallel setting vLLM would refuse or cannot load."""
    gpus = deployment.tp * deployment.dp
    if deployment.enable_expert_parallel and not model.is_moe:
        raise PlannerError(f"--enable-expert-parallel: {model.name} has no experts to split (a dense model; "
                           f"use --tp/--dp)")
    if not model.is_moe:
        return
    if deployment.enable_expert_parallel and gpus > model.num_experts:
        raise PlannerError(f"expert parallel size {gpus} (tp {deployment.tp} x dp {deployment.dp}) exceeds "
                           f"{model.name}'s {model.num_experts} experts: some GPUs would hold none")
    if not deployment.enable_expert_parallel and model.moe_intermediate_size % gpus:
        raise PlannerError(f"tp {deployment.tp} x dp {deployment.dp} = {gpus} GPUs do not split "
                           f"{model.name}'s expert width {model.moe_intermediate_size} evenly; "
                           f"add --enable-expert-parallel or change --tp/--dp")


def stage_layers(num_layers: int, pp: int) -> list[int]:
    """The layers of each pipeline stage, as vLLM's `get_pp_indices` (vllm/distributed/utils.py) splits
    them: num_layers // pp each, the remainder one more to each stage before the last."""
    layers = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        layers[-i] += 1
    return layers


def largest_stage(num_layers: int, pp: int) -> int:
    """The layers of the pipeline's largest stage, which sets its memory plan and its pace."""
    return max(stage_layers(num_layers, pp))


def layout_suffix(pp: int | None, dp: int | None = None) -> str:
    """' x pp2' after '4 x h100-sxm' for a pipelined deployment, ' x dp4' for one of data-parallel ranks (each
    its own tp x pp GPUs); '' for neither."""
    return (f" x pp{pp}" if pp and pp > 1 else "") + (f" x dp{dp}" if dp and dp > 1 else "")


def check_pipeline(model: ModelSpec, deployment: Deployment) -> None:
    """Raise a one-line PlannerError for a --pp setting the planner does not model (planner/sim/pipeline.py):
    it prices pipeline parallelism for vLLM v1 with one engine over a model whose layers are alike."""
    pp = deployment.pp
    if pp == 1:
        return
    refusals = [
        (deployment.policy != "vllm-v1", "the paper's vLLM v0.2.0 had no pipeline parallelism (--policy vllm-v1)"),
        (deployment.dp > 1, "not modelled with --dp (one engine per deployment)"),
        (deployment.speculative is not None, "not modelled with --speculative"),
        (pp > model.num_layers, f"leaves a stage without layers ({model.name} has {model.num_layers})"),
        (bool(model.sliding_layers or model.linear_attention or model.compressed_attention or model.sparse_indexer
              or model.ffn_layers),
         f"not modelled over {model.name}'s layers of different kinds (sliding, linear or compressed attention)"),
    ]
    for refused, why in refusals:
        if refused:
            raise PlannerError(f"--pp {pp}: {why}")


def check_block_fp8(model: ModelSpec, deployment: Deployment, layout: MoeLayout | None,
                    weight_format: WeightFormat | None, gpu: GpuSpec) -> list[str]:
    """Raise a one-line PlannerError where a 128 x 128 block-FP8 checkpoint's shards would cut its blocks,
    which vLLM refuses to load (module docstring); the warning where vLLM pads them instead."""
    if weight_format is None:
        return []
    tp = deployment.tp
    experts = weight_format.experts
    warnings = []
    if layout is not None and experts is not None and experts.scheme == "fp8-block" \
            and layout.width_per_gpu % FP8_BLOCK:
        if gpu.family not in PADDED_FP8_MOE or deployment.dp > 1:     # (vLLM pads under pure TP only)
            fits = [n for n in range(1, 65) if model.moe_intermediate_size % n == 0
                    and (model.moe_intermediate_size // n) % FP8_BLOCK == 0]
            raise PlannerError(
                f"{model.name}'s experts are stored in {FP8_BLOCK}x{FP8_BLOCK} FP8 blocks, and split {layout.moe_tp} "
                f"ways (tp {tp} x dp {deployment.dp}), each GPU would hold {layout.width_per_gpu} of an expert's "
                f"{model.moe_intermediate_size} rows: vLLM refuses to load it (\"The output_size of gate's and up's "
                f"weight = {layout.width_per_gpu} is not divisible by weight quantization block_n = {FP8_BLOCK}\") "
                f"on {gpu.name}; add --enable-expert-parallel, or split the experts over tp x dp = "
                f"{', '.join(map(str, fits))} GPUs")
        padded = -(-layout.width_per_gpu // FP8_BLOCK) * FP8_BLOCK
        warnings.append(
            f"{model.name}'s experts split {layout.moe_tp} ways leave {layout.width_per_gpu} of an expert's "
            f"{model.moe_intermediate_size} rows per GPU, not whole {FP8_BLOCK}-row FP8 blocks: vLLM loads that "
            f"on {gpu.name} only with FlashInfer's TRTLLM MoE since vllm#55867 (September 2026), padding each "
            f"share to {padded} rows, and refuses it before; the plan prices the unpadded share")
    if weight_format.scheme != "fp8-block" or tp == 1:
        return warnings
    widths = [("dense MLP", width) for _, width, _ in model.dense_mlp_kinds]
    if model.is_moe and model.shared_experts:
        widths.append(("shared experts'", model.shared_experts * model.moe_intermediate_size))
    for what, width in widths:
        if width % tp == 0 and (width // tp) % FP8_BLOCK:      # (a width tp does not divide cannot load at all)
            raise PlannerError(
                f"{model.name}'s {what} width {width} over --tp {tp} is not a whole number of its "
                f"{FP8_BLOCK}-wide FP8 blocks per GPU: vLLM refuses to load the {FP8_BLOCK}x{FP8_BLOCK} "
                f"block-FP8 checkpoint (\"Weight input_size_per_partition = {width // tp} is not divisible by "
                f"weight quantization block_k = {FP8_BLOCK}\"); use a --tp that leaves a multiple of {FP8_BLOCK}")
    return warnings


def parallel_warnings(model: ModelSpec, deployment: Deployment, node_gpus: int = NODE_GPUS) -> list[str]:
    """What vLLM runs unevenly (experts that do not divide over the EP ranks), and collectives that cross
    nodes (of `node_gpus` GPUs), priced from NCCL's model rather than measured."""
    gpus = deployment.tp * deployment.dp
    total = gpus * deployment.pp
    warnings = []
    if model.is_moe and deployment.enable_expert_parallel and model.num_experts % gpus:
        warnings.append(f"{model.num_experts} experts over EP{gpus}: vLLM gives {model.num_experts % gpus} GPUs "
                        f"one expert more ({-(-model.num_experts // gpus)}); the plan sizes memory and prices "
                        f"time by the most loaded GPU")
    # DeepEP's dispatch is priced from DeepEP's own measurements across nodes (planner/cost/all2all.py)
    deepep = MoeParallel(tp=deployment.tp, dp=deployment.dp, expert_parallel=deployment.enable_expert_parallel,
                         all2all=deployment.all2all_backend).deepep
    nccl_dispatch = model.is_moe and deployment.dp > 1 and not deepep
    crossing = ([f"--tp {deployment.tp}'s all-reduces"] if deployment.tp > node_gpus else []) + (
        ["the MoE dispatch over the dp ranks"] if nccl_dispatch and gpus > node_gpus else []) + (
        ["the hidden states between pipeline stages"] if deployment.pp > 1 and total > node_gpus else [])
    if crossing:
        link = node_link(deployment.node_link)
        nodes = nodes_of(total, node_gpus)
        warnings.append(f"{total} GPUs take {nodes} {node_gpus}-GPU nodes: {' and '.join(crossing)} cross "
                        f"the network ({link.name}, {link.bandwidth / 1e9:g} GB/s per GPU), priced from NCCL's "
                        f"latency model and the link's rate, not measured (planner/cost/nodes.py)")
    return warnings
