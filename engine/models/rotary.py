"""Rotary position embedding (RoPE) as Llama-family checkpoints expect it.

The "rotate half" (GPT-NeoX) convention is used: the first and second halves
of each head vector form the (real, imaginary) pairs. HF's Llama, Mistral and
Qwen2 checkpoints are stored for this convention, so no weight permutation is
needed.
"""

from __future__ import annotations

import math

import torch
from engine.models.errors import UnsupportedModelError

# Every architecture accepts these. YaRN is accepted by the architectures that
# pass YARN_ROPE_TYPES, those whose YaRN path is checked against transformers
# (tests/test_models_moe.py); the others keep refusing it.
BASIC_ROPE_TYPES = ("default", "linear", "llama3")
YARN_ROPE_TYPES = BASIC_ROPE_TYPES + ("yarn",)
# Phi-3's and Phi-4's LongRoPE (checked against transformers in tests/test_phi3_rope.py).
PHI3_ROPE_TYPES = BASIC_ROPE_TYPES + ("longrope",)


def rope_parameters(config) -> dict:
    """The config's RoPE settings as one dict with at least rope_type and rope_theta.

    transformers 5 folds rope_theta and rope_scaling into ``rope_parameters``;
    4.x configs keep them as separate attributes. Both are read here so a
    checkpoint works with either library version.
    """
    params = getattr(config, "rope_parameters", None)
    if params:
        params = dict(params)
    else:
        params = dict(getattr(config, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(config, "rope_theta", None) or 10000.0)
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    for key, default in (("partial_rotary_factor", 1.0), ("original_max_position_embeddings", None)):
        if params.get(key) is None and getattr(config, key, None) is not None:
            params[key] = getattr(config, key)
        params.setdefault(key, default)
    return params


def longrope_inv_freq(dim: int, params: dict, max_position: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """LongRoPE's short and long frequencies and its attention factor (Phi-3's 128k variants, Phi-4-mini).

    Each frequency is divided by a per-dimension factor, the short ones within the pretraining length
    (original_max_position_embeddings), the long ones past it; cos and sin are scaled by
    sqrt(1 + ln(s) / ln(original)), s = max_position / original, unless the config gives the factor.
    """
    old_len = params["original_max_position_embeddings"]
    if not old_len:
        raise UnsupportedModelError("longrope needs original_max_position_embeddings")
    factor = params.get("factor") or max_position / old_len
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(old_len))
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
    short, long_ = (1.0 / (torch.tensor(params[key], dtype=torch.float32, device="cpu") * params["rope_theta"] ** exponents)
                    for key in ("short_factor", "long_factor"))
    return short, long_, float(attention_factor)


def llama3_inv_freq(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    """Llama 3.1 frequency rescaling for long context.

    Long wavelengths (low frequencies) are slowed down by ``factor``, short ones
    are left alone, and the band between is blended linearly in
    ``original_max_position_embeddings / wavelength`` so nothing jumps.
    """
    factor = params["factor"]
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    old_len = params["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    blend = (old_len / wavelen - low) / (high - low)
    blended = (1 - blend) * scaled / factor + blend * scaled
    in_between = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(in_between, blended, scaled)


def yarn_inv_freq(head_size: int, params: dict, max_position: int) -> tuple[torch.Tensor, float]:
    """YaRN's frequencies and its attention factor (the paper's sqrt(1/t)).

    High frequencies (dimensions that turn many times within the original
    context) are kept, low ones are interpolated by ``factor``, and a linear
    ramp between ``beta_fast`` and ``beta_slow`` rotations blends the two.
    The attention factor multiplies cos and sin, i.e. scales every q.k by its
    square, to keep the softmax's temperature at long range. Written from the
    paper and transformers' ``_compute_yarn_parameters`` (whose rounding it
    follows op for op, so tables match bit for bit).
    """
    base = params["rope_theta"]
    old_len = params["original_max_position_embeddings"]
    factor = params.get("factor") or max_position / old_len

    def mscale(scale: float, weight: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * weight * math.log(scale) + 1.0

    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        if params.get("mscale") and params.get("mscale_all_dim"):
            attention_factor = mscale(factor, params["mscale"]) / mscale(factor, params["mscale_all_dim"])
        else:
            attention_factor = mscale(factor)

    def dimension_of(rotations: float) -> float:
        """The dimension whose wavelength fits ``rotations`` times into the original context."""
        return head_size * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dimension_of(params.get("beta_fast") or 32), dimension_of(params.get("beta_slow") or 1)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_size - 1)
    if low == high:
        high += 0.001  # a one-dimension ramp would divide by zero
    ramp = ((torch.arange(head_size // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # share of the original (extrapolated) frequency per dimension
    pos_freqs = base ** (torch.arange(0, head_size, 2, dtype=torch.int64, device="cpu").float() / head_size)
    inv_freq = 1.0 / (factor * pos_freqs) * (1 - keep) + 1.0 / pos_freqs * keep
    return inv_freq, float(attention_factor)


class RotaryEmbedding:
    """Applies RoPE to packed query/key tensors given each token's absolute position.

    The cos/sin table for every position up to max_position is computed once
    in fp32 on the CPU (like HF, so rounding matches) and moved to the device
    on first use. It is a plain attribute, not a buffer: models are built on
    the meta device and materialized with ``to_empty``, which would wipe a
    buffer.
    """

    def __init__(self, head_size: int, max_position: int, params: dict, rope_types: tuple = BASIC_ROPE_TYPES,
                 partial: bool = False):
        """`partial`: the architecture turns only the first partial_rotary_factor of each head (Phi-3's
        apply_rotary_pos_emb); the others refuse a config that asks for it."""
        rope_type = params["rope_type"]
        if rope_type not in rope_types:
            raise UnsupportedModelError(f"rope_type {rope_type!r} is not supported ({', '.join(rope_types)} are)")
        partial_factor = params.get("partial_rotary_factor", 1.0)
        if partial_factor != 1.0 and not partial:
            raise UnsupportedModelError("partial rotary embeddings are not supported by this architecture")
        dim = int(head_size * partial_factor)          # the leading dims of each head that turn; the rest pass through
        inv_freq = 1.0 / (params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
        attention_factor, long_freq = 1.0, None
        if rope_type == "llama3":
            inv_freq = llama3_inv_freq(inv_freq, params)
        elif rope_type == "linear":
            inv_freq = inv_freq / params["factor"]
        elif rope_type == "yarn":
            inv_freq, attention_factor = yarn_inv_freq(dim, params, max_position)
        elif rope_type == "longrope":
            inv_freq, long_freq, attention_factor = longrope_inv_freq(dim, params, max_position)
        # Long-context checkpoints may run past max_position_embeddings of the
        # original model; the table covers the config's limit.
        self._tables = {"short": _cos_sin_table(inv_freq, max_position, attention_factor)}
        # LongRoPE turns a step past the pretraining length with the long frequencies: transformers switches
        # a whole forward pass once its last position reaches original_max_position_embeddings, and vLLM a
        # whole batch (Phi3LongRoPEScaledRotaryEmbedding), so a step here switches when any of its tokens does
        self._long_from = None
        if long_freq is not None:
            self._tables["long"] = _cos_sin_table(long_freq, max_position, attention_factor)
            self._long_from = params["original_max_position_embeddings"]

    def _table(self, which: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self._tables[which]
        if cos.device != device:
            cos, sin = self._tables[which] = cos.to(device), sin.to(device)
        return cos, sin

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [T, 1, rotary dims] of each token's position, in ``dtype``.

        Computed once per step and shared by every layer: the positions are
        the same in all of them.
        """
        long_ = self._long_from is not None and int(positions.max()) >= self._long_from
        cos, sin = self._table("long" if long_ else "short", positions.device)
        return cos[positions].unsqueeze(1).to(dtype), sin[positions].unsqueeze(1).to(dtype)

    @staticmethod
    def apply(cos_sin: tuple[torch.Tensor, torch.Tensor], query: torch.Tensor, key: torch.Tensor):
        """query [T, num_heads, d], key [T, num_kv_heads, d] -> rotated copies."""
        cos, sin = cos_sin
        return _rotate(query, cos, sin), _rotate(key, cos, sin)

    def __call__(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
        """query [T, num_heads, d], key [T, num_kv_heads, d] -> rotated copies."""
        return self.apply(self.cos_sin(positions, query.dtype), query, key)


def _cos_sin_table(inv_freq: torch.Tensor, max_position: int, attention_factor: float):
    positions = torch.arange(max_position, dtype=torch.int64, device="cpu").float()
    freqs = torch.outer(positions, inv_freq)
    angles = torch.cat([freqs, freqs], dim=-1)  # [max_position, rotary dims]
    cos, sin = angles.cos(), angles.sin()
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos, sin


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    turned = cos.shape[-1]
    if turned != x.shape[-1]:                   # partial rotary: the dims past the table pass through
        return torch.cat([_rotate(x[..., :turned], cos, sin), x[..., turned:]], dim=-1)
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin
