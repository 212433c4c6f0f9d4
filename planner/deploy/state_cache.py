"""How vLLM v1 lays out the cache of a Gated DeltaNet hybrid (Qwen3-Next, Qwen3.5): one pool of equal pages
for the attention layers' K and V and the linear-attention layers' recurrent states.

vLLM's hybrid KV cache manager needs one page size for every layer, and a layer's recurrent state (hundreds
of KB to MB) is far larger than 16 tokens of its K and V. So it raises the attention block size until one
block of one attention layer holds at least one layer's state, in steps of the attention kernel's
alignment (16 tokens; 32 on Blackwell B200 with 256-wide heads under FlashInfer), and pads the state to
that page (vllm/model_executor/models/config.py, HybridAttentionMambaModelConfig; without prefix caching,
the smallest such size). Qwen3.5-35B-A3B on one GPU: a state of 2,146,304 bytes against 2,048 bytes per
token of K and V makes 1,056-token blocks.

The layers are then grouped in equal numbers per group (vllm/v1/core/kv_cache_utils.py: the smaller
type's layer count, or the larger's when they are within 25%): Qwen3.5's 3:1 gives one group of its
attention layers and three of its linear ones. A block id names one page in every layer of a group. A
sequence holds a block per block_size tokens in the attention group and one block in each linear group
for its whole life (the state of mamba_cache_mode "none"), so a simulator block is the attention groups'
pages and a sequence's state is `state_blocks` of them on top of its tokens' blocks.

DeepSeek-V4 (planner/catalog/deepseek_v4.py) runs on 256-token blocks of compressed rows; what a sequence
holds whatever its length (every layer's window rows and each compressor's state, ~18 MB for V4-Flash) is
likewise counted as `state_blocks` of those blocks, rounded up, held from admission to the end.
"""
from __future__ import annotations

from planner.catalog import SM100_FAMILIES, GpuSpec, ModelSpec
from planner.catalog.deepseek_v4 import COMPRESSED_BLOCK


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# FlashMLA's sparse kernels and the DSA indexer's take 64-token blocks only, and vLLM sets that size for a
# model with an indexer (platforms/cuda.py in vLLM 0.12; the backends' get_supported_kernel_block_sizes in 0.19)
SPARSE_MLA_BLOCK_SIZE = 64


def kernel_alignment(model: ModelSpec, gpu: GpuSpec) -> int:
    """The attention kernel's block-size step: FlashInfer takes no 16-token blocks of 256-wide heads on
    compute capability 10.x (flashinfer issue 1993, as vLLM's config hook says)."""
    return 32 if gpu.family in SM100_FAMILIES and model.head_size == 256 else 16


def cache_block_size(model: ModelSpec, gpu: GpuSpec, tp: int, dtype_bytes: int, kv_dtype_bytes: int,
                      block_size: int) -> int:
    """The attention block size vLLM runs `model` with: `block_size`; for a Gated DeltaNet hybrid the
    smallest multiple of the kernel's alignment whose page of one layer's K and V holds one layer's
    state, when that is larger; for DeepSeek Sparse Attention the 64 its kernels take, for DeepSeek-V4 the 256
    of its compressed rows' kernel."""
    if model.sparse_indexer is not None:
        return SPARSE_MLA_BLOCK_SIZE
    if model.compressed_attention is not None:
        return COMPRESSED_BLOCK
    if model.linear_attention is None:
        return block_size
    state = model.linear_attention.state_bytes_per_gpu(tp, dtype_bytes)
    token = model.kv_cache_bytes(tp, kv_dtype_bytes)
    step = kernel_alignment(model, gpu)
    return max(block_size, step * _cdiv(state, step * token))


def cache_groups(model: ModelSpec) -> tuple[int, int, int]:
    """(layers per group, attention groups, linear-attention groups) of a hybrid's cache; (layers, 1, 0)
    for a model without linear attention."""
    full, linear = model.full_attention_layers, model.linear_attention_layers
    if not linear:
        return model.num_layers, 1, 0
    size = min(full, linear)
    if max(full, linear) < 1.25 * size:
        size = max(full, linear)
    return size, _cdiv(full, size), _cdiv(linear, size)


def state_blocks(model: ModelSpec) -> int:
    """Simulator blocks (one page in each attention group) a running sequence of `model` holds for its
    recurrent states: one block id per linear-attention group; DeepSeek-V4's window rows and compressor
    states in whole blocks; 0 without either."""
    ca = model.compressed_attention
    if ca is not None:
        head, rope = model.head_size, model.rotary_dims
        return _cdiv(ca.sequence_bytes(head, rope), ca.block_bytes(head, rope))
    _, full_groups, linear_groups = cache_groups(model)
    return _cdiv(linear_groups, full_groups)


def block_layers(model: ModelSpec) -> int:
    """Layers whose page a simulator block spans: every attention group's layers, padding included."""
    size, full_groups, _ = cache_groups(model)
    return size * full_groups
