"""The linear layers a quantized checkpoint keeps in 16 bits.

A checkpoint's quantization config names the modules it leaves unquantized: ModelOpt's `exclude_modules`
(hf_quant_config.json, or a `modelopt` quantization_config), compressed-tensors' `ignore`, and the
`modules_to_not_convert` of Hugging Face's FP8, AWQ, GPTQ and MXFP4 configs. vLLM gives those layers the
unquantized linear method (ModelOpt's `is_layer_excluded`: an exact name or a `*` wildcard matched over
the whole name; compressed-tensors' `should_ignore_layer`: exact names or `re:` regular expressions). It
matters: NVIDIA's NVFP4 releases of DeepSeek-V3.1/V3.2, GLM-5, Kimi-K2.6, MiniMax-M2.5 and Qwen3.5 keep the
attention projections (and shared experts, the first dense layers or the Gated DeltaNet projections) in
bf16, which is about 4x their NVFP4 bytes and is multiplied on the 16-bit tensor cores.

The patterns are matched against each of the model's linear modules by the name its checkpoint gives it
(`model.layers.N.self_attn.q_proj`; a vision-language wrapper's `model.language_model.layers.N` and
`language_model.model.layers.N` are folded onto `model.layers.N`; Nemotron-H's blocks are
`backbone.layers.N.mixer`, N counting every block of its hybrid_override_pattern; a DeciLM's are Llama's,
N its decoder layer). The result is, per role (attention,
linear_attention, mlp, shared_experts, latent, indexer) and per weight of the role's one-layer shape tuple on
ModelSpec (attention_shapes, linear_attention_shapes, mlp_shapes, shared_expert_shapes, latent_shapes,
indexer_shapes), the fraction of the role's
layers in which the checkpoint keeps that weight in 16 bits. A MoE's routed experts and routers are not
listed here: routers are 16-bit in vLLM whatever the config says, and no checkpoint we know excludes experts.

ModelOpt's MIXED_PRECISION (vLLM's `modelopt_mixed`) goes further: its `quantized_layers` name each quantized
module with its own format, and a linear layer it does not name stays 16-bit (ModelOptMixedPrecisionConfig's
get_quant_method: a name listed itself, or a parent of listed names, as `mlp.experts` is). `format_shares`
gives, per role and weight, the formats the role's layers store it in and the fraction of layers of each.
"""
from __future__ import annotations

import fnmatch
import re
from collections import Counter
from functools import lru_cache
from typing import Any

from planner.catalog.nemotron_nas import NEMOTRON_NAS_TYPES

ROLES = ("attention", "linear_attention", "mlp", "shared_experts", "latent", "indexer")

# Wrapper prefixes of vision-language checkpoints, folded onto the text model's `model.layers.`
_WRAPPERS = (("model.language_model.layers.", "model.layers."), ("language_model.model.layers.", "model.layers."))


def _fold(pattern: str) -> str:
    for wrapped, plain in _WRAPPERS:
        if pattern.startswith(wrapped):
            return plain + pattern[len(wrapped):]
    return pattern


def is_excluded(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether a checkpoint that excludes `patterns` keeps module `name` unquantized: an exact name or a
    parent module's, a `*` wildcard over the whole name, or a compressed-tensors `re:` expression."""
    for pattern in patterns:
        if pattern.startswith("re:"):
            if re.match(_fold(pattern[3:]), name):
                return True
            continue
        pattern = _fold(pattern)
        if name == pattern or name.startswith(pattern + ".") or fnmatch.fnmatchcase(name, pattern):
            return True
    return False


def _names(model: Any) -> dict[str, tuple[tuple[str, ...], ...]]:
    """Per role, the checkpoint's name(s) of each weight of the role's shape tuple (a weight some releases
    split or fuse lists each spelling)."""
    attn = ("self_attn.q_proj",), ("self_attn.k_proj",), ("self_attn.v_proj",), ("self_attn.o_proj",)
    if model.is_mla:         # planner/catalog/mla.py attention_shapes: split ones, then the replicated ones
        q = "self_attn.q_b_proj" if model.q_lora_rank else "self_attn.q_proj"
        attn = ((q,), ("self_attn.kv_b_proj",), ("self_attn.o_proj",))
        attn += (("self_attn.q_a_proj",),) if model.q_lora_rank else ()
        attn += (("self_attn.kv_a_proj_with_mqa",),)
    shared = tuple((f"mlp.shared_experts.{w}", f"mlp.shared_expert.{w}") for w in ("gate_proj", "up_proj", "down_proj"))
    if model.is_gemma and model.is_moe:      # Gemma 4's dense MLP beside its experts (its "shared expert")
        shared = (("mlp.gate_proj",), ("mlp.up_proj",), ("mlp.down_proj",))
    if _mixer_blocks(model):          # Nemotron-H: every block's one module is its mixer
        return {"attention": (("mixer.q_proj",), ("mixer.k_proj",), ("mixer.v_proj",), ("mixer.o_proj",)),
                "linear_attention": (("mixer.in_proj",), ("mixer.out_proj",)),
                "mlp": (("mixer.up_proj",), ("mixer.down_proj",)),
                "shared_experts": (("mixer.shared_experts.up_proj",), ("mixer.shared_experts.down_proj",)),
                "latent": (("mixer.fc1_latent_proj",), ("mixer.fc2_latent_proj",)), "indexer": ()}
    return {"attention": attn,
            "linear_attention": (("linear_attn.in_proj_qkvz", "linear_attn.in_proj_qkv", "linear_attn.in_proj_z"),
                                 ("linear_attn.in_proj_ba", "linear_attn.in_proj_b", "linear_attn.in_proj_a"),
                                 ("linear_attn.out_proj",)),
            "mlp": ((("fc1",), ("fc2",)) if model.is_gpt_like
                    else (("mlp.gate_proj",), ("mlp.up_proj",), ("mlp.down_proj",))),
            "shared_experts": shared, "latent": (),
            "indexer": (("self_attn.indexer.wq_b",), ("self_attn.indexer.wk",), ("self_attn.indexer.weights_proj",))}


def _layers(model: Any) -> dict[str, range | list[int]]:
    """The layer indices of each role: a Gated DeltaNet hybrid's full-attention layers are every
    (layers / attention layers)-th, the last of each group (Qwen3-Next's and Qwen3.5's layer_types); a
    MoE's dense MLPs are its first layers (DeepSeek's first_k_dense_replace); Nemotron-H's blocks are where
    its pattern puts them (a DeciLM's in the decoder layer that holds them, two blocks a layer); a DSA indexer is
    on the layers vLLM builds one on (GLM-5.2: 21 of 78)."""
    if model.block_pattern:
        per_layer = 2 if model.model_type in NEMOTRON_NAS_TYPES else 1
        at = {kind: [i // per_layer for i, c in enumerate(model.block_pattern) if c == kind] for kind in "*M-E"}
        return {"attention": at["*"], "linear_attention": at["M"], "mlp": at["-"],
                "shared_experts": at["E"] if model.shared_experts else [],
                "latent": at["E"] if model.moe_latent_size else [], "indexer": []}
    layers = range(model.num_layers)
    every = model.num_layers // model.attention_layers if model.linear_attention is not None else 1
    attention = [i for i in layers if i % every == every - 1]
    linear = [i for i in layers if i % every != every - 1]
    mlp = range(model.dense_layers) if model.is_moe else layers
    return {"attention": attention, "linear_attention": linear, "mlp": mlp,
            "shared_experts": range(model.dense_layers, model.num_layers) if model.shared_expert_width else [],
            "latent": [], "indexer": list(model.sparse_indexer.indexed_layers(model.num_layers))
            if model.sparse_indexer is not None else []}


def _mixer_blocks(model: Any) -> bool:
    """Whether the checkpoint names each block's one module `mixer` (Nemotron-H's, not a DeciLM's)."""
    return bool(model.block_pattern) and model.model_type not in NEMOTRON_NAS_TYPES


def _prefix(model: Any) -> str:
    return "backbone.layers." if _mixer_blocks(model) else "model.layers."


@lru_cache(maxsize=64)
def kept_fractions(model: Any, patterns: tuple[str, ...]) -> dict[str, tuple[float, ...]]:
    """Per role, the fraction of its layers in which each weight of its one-layer shape tuple is kept in
    16 bits (module docstring); {} when nothing is excluded."""
    if not patterns:
        return {}
    names, layers = _names(model), _layers(model)
    prefix = _prefix(model)
    kept = {}
    for role in ROLES:
        indices = layers[role]
        if not indices:
            continue
        fractions = tuple(sum(any(is_excluded(f"{prefix}{i}.{n}", patterns) for n in spellings)
                              for i in indices) / len(indices) for spellings in names[role])
        if any(fractions):
            kept[role] = fractions
    return kept


# (a weight's format, or None for 16 bits; the fraction of the role's layers that store it so)
Shares = tuple[tuple[Any, float], ...]


class _Listed:
    """A mixed config's quantized_layers, looked up as vLLM looks them up: a module's own name, the name of a
    parent of listed modules (a fused-MoE `mlp.experts` over its listed projections), or a `*` pattern the
    extraction folded per-layer names into (scripts/extract_checkpoint_formats.py)."""

    def __init__(self, layers: tuple[tuple[str, Any], ...]) -> None:
        self.names: dict[str, Any] = {}
        self.patterns = []
        for pattern, fmt in layers:
            pattern = _fold(pattern)
            if "*" in pattern:
                self.patterns.append((pattern, fmt))
                continue
            self.names.setdefault(pattern, fmt)
            parts = pattern.split(".")
            for end in range(1, len(parts)):
                self.names.setdefault(".".join(parts[:end]) + ".", fmt)

    def format_of(self, name: str) -> Any:
        found = self.names.get(name, self.names.get(name + "."))
        if found is None:
            found = next((fmt for pattern, fmt in self.patterns if fnmatch.fnmatchcase(name, pattern)), None)
        return found


@lru_cache(maxsize=64)
def format_shares(model: Any, fmt: Any) -> dict[str, tuple[Shares, ...]]:
    """Per role, per weight of its one-layer shape tuple, the formats the role's layers store it in and the
    fraction of them each holds (None: 16 bits): `fmt` except where the checkpoint excludes the module, or a
    mixed config's entry for it (module docstring). Only the roles not wholly in `fmt` have an entry (`stored_as`
    reads the rest)."""
    if not (fmt.excluded or fmt.is_mixed):
        return {}
    names, layers = _names(model), _layers(model)
    prefix = _prefix(model)
    listed = _Listed(fmt.layers) if fmt.is_mixed else None

    def stored(layer: int, spellings: tuple[str, ...]) -> Any:
        full = [f"{prefix}{layer}.{n}" for n in spellings]
        if any(is_excluded(name, fmt.excluded) for name in full):
            return None
        if listed is None:
            return fmt
        return next((found for found in map(listed.format_of, full) if found is not None), None)

    shares = {}
    for role in ROLES:
        indices = layers[role]
        if not indices:
            continue
        per_weight = tuple(tuple((f, count / len(indices)) for f, count in
                                 Counter(stored(i, spellings) for i in indices).items())
                           for spellings in names[role])
        if listed is not None or any(stored != ((fmt, 1.0),) for stored in per_weight):
            shares[role] = per_weight
    return shares


def stored_as(shares: dict[str, tuple[Shares, ...]], fmt: Any, role: str, index: int) -> Shares:
    """Weight `index` of the role's shape tuple: its entry in `shares` (format_shares), else wholly `fmt` (16 bits
    for a mixed checkpoint's role without layers)."""
    if role in shares:
        return shares[role][index]
    return ((None if fmt.is_mixed else fmt, 1.0),)


def format_share(model: Any, fmt: Any, role: str, shapes: tuple[tuple[int, int], ...],
                 indices: tuple[int, ...]) -> Shares:
    """The weight-weighted shares of the role's weights `indices` (of its shape tuple `shapes`) in each format:
    what a fused GEMM of them (q, k and v; gate and up) multiplies in each."""
    shares = format_shares(model, fmt)
    if role not in shares:
        return stored_as(shares, fmt, role, 0)
    sizes = [shapes[i][0] * shapes[i][1] for i in indices]
    total: dict[Any, float] = {}
    for i, size in zip(indices, sizes):
        for f, fraction in shares[role][i]:
            total[f] = total.get(f, 0.0) + fraction * size
    return tuple((f, weight / sum(sizes)) for f, weight in total.items())
