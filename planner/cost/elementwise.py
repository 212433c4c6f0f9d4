"""The memory-bound kernels of a vLLM decoder step that no measured table covers, and the bytes each moves per token.

NVIDIA's tables time the GEMMs, attention and all-reduces; between them vLLM
runs small kernels that read and write activations: the norms (with the
residual add fused in: vLLM's fused_add_rms_norm, or Inductor's fusion of the
same), Qwen3's per-head q/k norms, the rotary embedding, the KV-cache write
(reshape_and_cache_flash, before FlashAttention), the gated activation
(SiluAndMul), and once per step the embedding lookup and the final norm.
Each is priced like aiconfigurator's own ElementWise op: bytes over the
effective bandwidth (the datasheet bandwidth x the system file's empirical
factor, 0.8 on every system), plus a fixed time per kernel (the floor; a
kernel of a few KB still costs its launch and ramp inside a CUDA graph):
aiconfigurator's own constant for it (systems/<gpu>.yaml
mem_empirical_constant_latency, 3 us), kept in
planner/data/measured_calibration.json with the fitted host times. It is not
fitted: every step of a model launches the same number of these kernels, so on
end-to-end runs the floor cannot be told from a per-step host time
(docs/calibration.md).

Bytes are per token of this GPU's shard, 16-bit activations: a norm reads the
hidden state and the residual and writes both back (4 x hidden x 2 bytes);
rotary and the q/k norms read and write this GPU's q and k heads; the cache
write reads k and v and stores them at the cache's element size; SiluAndMul
reads gate and up (2 x intermediate / tp) and writes their product. OPT and
GPT-2 have LayerNorm and a plain activation, learned positions instead of
rotary, and are counted the same way. A MoE layer's activation runs inside the
fused-MoE kernel, which its own table times (planner/cost/measured_moe.py).
Gemma 3 normalizes the attention's and the MLP's outputs too before adding them
back (vLLM runs those two as plain RMSNorms: read and write the hidden state),
and scales the embedding by sqrt(hidden) (one more read and write per step).
Multi-head latent attention (DeepSeek; planner/catalog/mla.py) normalizes its two latents (q's and
the KV's: read and write each), applies rotary to the rotary dims only (each head's and the one shared
key's) and writes the latent and rotary key into the cache; its shared experts run their own SiLU and
mul on each MoE layer.
A Gated DeltaNet hybrid (Qwen3.5; planner/catalog/linear_attention.py) runs the q/k norms, rotary and
the cache write on its attention layers only, gates each attention output (read it and the gate, write
the product), and on its linear-attention layers normalizes the read-out with its z gate (read both,
write one); the convolution and the recurrent update are timed kernels (planner/cost/gdn.py).
Nemotron-H (planner/catalog/nemotron_h.py) runs one RMSNorm and residual add per block, no rotary, a
squared ReLU (read and write) on its MLPs and shared experts, and its Mamba-2 mixers' gated RMSNorm; their
convolution and scan are priced in planner/cost/mamba.py.
Gemma 4 (planner/catalog/gemma4.py) normalizes q, k and v per head and runs rotary and the cache write at
each kind of layer's own head shape (its full layers' and its sliding layers' kernels apart), and on a MoE
layer the dense MLP's GELU-tanh and mul beside the experts and four more norms: the router's input, the
experts' input, and each branch's output before their sum.
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.catalog import ModelSpec
from planner.catalog.gemma4 import GEMMA4_TYPES

ACT_BYTES = 2          # activations stay 16-bit (bf16 / fp16) between the kernels


@dataclass(frozen=True, slots=True)
class Kernel:
    """One memory-bound kernel: launched once per layer (`per_layer`; on `layers` of them when only some
    run it), or once per step."""

    name: str
    bytes_per_token: int
    per_layer: bool = True
    layers: int | None = None

    def launches(self, num_layers: int) -> int:
        """How many times one forward pass of a `num_layers`-layer model runs it."""
        return (self.layers if self.layers is not None else num_layers) if self.per_layer else 1


def step_kernels(model: ModelSpec, tp: int, kv_bytes: int) -> tuple[Kernel, ...]:
    """The elementwise kernels of one forward pass of `model` on one of `tp` GPUs, in the order they run."""
    h = model.hidden_size
    q_heads, hd = model.num_heads // tp, model.head_size
    inter = model.intermediate_size // tp
    norm = "LayerNorm" if model.is_gpt_like else "RMSNorm"
    gemma = model.is_gemma
    blocks = model.num_layers + model.ffn_layers if model.ffn_layers else None    # Nemotron-H: one norm a block
    # Gemma 4's full and sliding layers attend with heads of their own shape: their kernels apart
    kinds = [(layers, spec, model.attention_kind_label(spec)) for layers, spec in model.attention_kinds]
    kernels = [Kernel("embedding lookup", 2 * h * ACT_BYTES + (h * ACT_BYTES if model.is_gpt_like else 0), False),
               Kernel(f"input {norm} + residual add", 4 * h * ACT_BYTES, layers=blocks)]
    if gemma:
        kernels.insert(1, Kernel("embedding scale", 2 * h * ACT_BYTES, False))
    if model.qk_norm:
        # Gemma 4 normalizes v too (without a weight)
        normed = "q/k/v" if model.model_type in GEMMA4_TYPES else "q/k"
        for layers, spec, label in kinds:
            kv_heads = spec.kv_heads_per_gpu(tp) * (2 if normed == "q/k/v" else 1)
            kernels.append(Kernel(f"{normed} RMSNorm{label}", 2 * (q_heads + kv_heads) * spec.head_size * ACT_BYTES,
                                  layers=layers))
    if model.is_mla:
        kernels.append(Kernel("q and KV latent RMSNorms", 2 * (model.q_lora_rank + model.kv_lora_rank) * ACT_BYTES))
    if model.rotary_dims:
        # rotary touches the rotary dims only (MLA: each head's and the one shared key's; GLM: half of each head)
        for layers, spec, label in kinds:
            rotated = ((q_heads + 1) if model.is_mla else (q_heads + spec.kv_heads_per_gpu(tp))) * spec.rotary_dims
            kernels.append(Kernel(f"rotary embedding{label}", 2 * rotated * ACT_BYTES, layers=layers))
    index = model.sparse_indexer
    index_key = index.key_bytes if index is not None else 0     # written by the indexer, on its layers (below)
    for layers, spec, label in kinds:
        kernels.append(Kernel(f"KV-cache write{label}", spec.kv_cache_width(tp) * ACT_BYTES
                              + spec.kv_cache_bytes(tp, kv_bytes) - index_key, layers=layers))
    if index is not None:      # its q read in bf16 and written in FP8; the rotary dims of q and k; its key cached
        kernels.append(Kernel("indexer q/k rotary, FP8 quantize, k LayerNorm",
                              index.heads * index.head_dim * (ACT_BYTES + 1)
                              + 2 * (index.heads + 1) * model.qk_rope_head_dim * ACT_BYTES
                              + 2 * index.head_dim * ACT_BYTES + index_key, layers=model.indexer_layers))
    if model.attention_output_gate:
        kernels.append(Kernel("attention output gate", 3 * q_heads * hd * ACT_BYTES, layers=model.attention_layers))
    if model.linear_attention is not None:
        width = model.linear_attention.gated_norm_width_per_gpu(tp)
        kernels.append(Kernel("linear attention gated RMSNorm", 3 * width * ACT_BYTES,
                              layers=model.linear_attention_layers))
    if gemma:
        kernels.append(Kernel("post-attention RMSNorm", 2 * h * ACT_BYTES))
    if blocks is None:
        second = "pre-feedforward" if gemma else "post-attention"
        kernels.append(Kernel(f"{second} {norm} + residual add", 4 * h * ACT_BYTES))
    # a MoE's fused kernel applies its activation itself (its measured table includes it)
    if model.is_gpt_like:
        kernels.append(Kernel("activation", 2 * inter * ACT_BYTES))
    elif not model.is_moe:
        mlps = model.dense_mlp_kinds                  # a DeciLM's MLPs by width
        kernels += [_activation(model, f"{width}-wide " if len(mlps) > 1 else "", width // tp, layers)
                    for layers, width, _ in mlps]
    if model.shared_expert_width:
        shared = model.shared_expert_width // tp
        what = "MLP " if gemma else "shared expert "          # Gemma 4's dense MLP beside its experts
        kernels.append(_activation(model, what, shared, model.moe_layers))
    if gemma and model.is_moe:
        # Gemma 4's expert branch: the router's input normalized and scaled, the experts' input normalized,
        # both branches' outputs normalized, then summed
        kernels += [Kernel("router RMSNorm and scale", 2 * h * ACT_BYTES, layers=model.moe_layers),
                    Kernel("pre-feedforward RMSNorm 2", 2 * h * ACT_BYTES, layers=model.moe_layers),
                    Kernel("post-feedforward RMSNorm 1", 2 * h * ACT_BYTES, layers=model.moe_layers),
                    Kernel("post-feedforward RMSNorm 2 + branch sum", 4 * h * ACT_BYTES, layers=model.moe_layers)]
    if gemma:
        kernels.append(Kernel("post-feedforward RMSNorm", 2 * h * ACT_BYTES))
    kernels.append(Kernel(f"final {norm}", 4 * h * ACT_BYTES, False))
    return tuple(kernels)


def _activation(model: ModelSpec, what: str, width: int, layers: int) -> Kernel:
    """An MLP's activation on `width` channels: a gated one reads gate and up and writes their product;
    Nemotron-H's squared ReLU reads and writes one."""
    if not model.gated_mlp:
        return Kernel(f"{what}squared ReLU", 2 * width * ACT_BYTES, layers=layers)
    name = "GELU-tanh and mul" if model.is_gemma else "SiLU and mul"
    return Kernel(f"{what}{name}", 3 * width * ACT_BYTES, layers=layers)
