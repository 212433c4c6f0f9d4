"""Gated DeltaNet hybrids: Qwen3-Next (model_type qwen3_next) and Qwen3.5/3.6 (qwen3_5_text, qwen3_5_moe_text).

Three of every four layers replace softmax attention with a Gated DeltaNet ("linear attention",
layer_types "linear_attention"; full_attention_interval 4 when a config lists no layer types). Such a
layer projects each token to q and k (linear_num_key_heads heads of linear_key_head_dim), v and an
output gate z (linear_num_value_heads heads of linear_value_head_dim) and two per-value-head scalars
(b, a: the delta rule's write strength and decay), runs q, k and v through a causal depthwise
convolution of linear_conv_kernel_dim taps, updates a per-head recurrent state of key_head_dim x
value_head_dim, normalizes the read-out with a z-gated RMSNorm and projects it back. It keeps no KV
cache: a sequence holds a fixed state per layer, the convolution's last kernel - 1 inputs and the
recurrent matrix, whatever its length (vLLM's MambaSpec; the Qwen3.5 configs ask for the recurrent
matrix in float32, mamba_ssm_dtype, which vLLM's Qwen3.5 config hook passes on to its cache).

The other layers are grouped-query attention with per-head q/k RMSNorms, rotary on a quarter of each
256-wide head (partial_rotary_factor 0.25) and an output gate (attn_output_gate: q_proj is twice as wide,
half of it a sigmoid gate on the attention output). The MLP is Qwen3-MoE's with one always-on shared
expert (shared_expert_intermediate_size wide) behind a sigmoid gate (a hidden x 1 linear), or a dense
gated MLP (Qwen3.5-27B). The multi-token-prediction layer (mtp_num_hidden_layers) is loaded only when it
drafts, so it is not counted. Qwen3.5's checkpoints wrap this decoder in a vision-language model
(planner/catalog/multimodal.py reads the wrapper and counts the vision tower).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from planner.catalog.moe_config import dense_layer_count, shared_expert_count
from planner.catalog.quantization import checkpoint_scheme
from planner.catalog.rope import partial_rotary_dims
from planner.errors import PlannerError

# Qwen3.5's decoders go by their text_config names: "qwen3_5" and "qwen3_5_moe" are the vision-language wrappers
LINEAR_ATTENTION_TYPES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
LINEAR_ATTENTION_MOE_TYPES = ("qwen3_next", "qwen3_5_moe_text")
STATE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}     # a recurrent state's dtype in a config
STATE_DTYPE_NAMES = {4: "float32", 2: "bfloat16"}


def check_mixer(mixer: Any, sizes: tuple[str, ...], what: str) -> None:
    """A recurrent mixer's (Gated DeltaNet's, Mamba-2's) `sizes` are positive integers and its state's element
    size one a config can name; else a one-line error."""
    for field in sizes:
        value = getattr(mixer, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlannerError(f"{what}: {field} must be a positive integer, got {value!r}")
    if mixer.state_dtype_bytes not in (0, 2, 4):
        raise PlannerError(f"{what}: state_dtype_bytes must be 0, 2 or 4, got {mixer.state_dtype_bytes!r}")


def state_dtype_bytes(dtype: Any, key: str, name: str) -> int:
    """The element size of the recurrent state a config's `key` names (`dtype`; None: 0, the model's dtype)."""
    if dtype is None:
        return 0
    if dtype not in STATE_DTYPE_BYTES:
        raise PlannerError(f"model {name!r}: {key} must be one of {', '.join(STATE_DTYPE_BYTES)}, got {dtype!r}")
    return STATE_DTYPE_BYTES[dtype]


@dataclass(frozen=True, slots=True)
class LinearAttention:
    """The Gated DeltaNet layers of a hybrid model: how many, and their head shapes."""

    layers: int
    key_heads: int
    value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    state_dtype_bytes: int = 0      # the recurrent state's element size; 0: the model's dtype

    kind = "Gated DeltaNet"
    in_weights = (0, 1)             # of `shapes`: q, k, v, z and b, a (one GEMM in vLLM); the output last

    def __post_init__(self) -> None:
        check_mixer(self, ("layers", "key_heads", "value_heads", "key_head_dim", "value_head_dim", "conv_kernel"),
                    "linear attention")
        if self.value_heads % self.key_heads:
            raise PlannerError(f"linear attention: {self.value_heads} value heads are not a multiple of "
                               f"{self.key_heads} key heads")

    @property
    def key_dim(self) -> int:
        return self.key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal convolution: q, k and v."""
        return 2 * self.key_dim + self.value_dim

    def shapes(self, hidden: int) -> tuple[tuple[int, int], ...]:
        """(outputs, inputs) of one layer's linear weights: q, k, v and z in one, b and a, the output."""
        return ((2 * self.key_dim + 2 * self.value_dim, hidden), (2 * self.value_heads, hidden),
                (hidden, self.value_dim))

    @property
    def other_params(self) -> int:
        """One layer's convolution taps, per-head decay (A_log) and step bias (dt_bias), and its gated
        RMSNorm (one value_head_dim weight shared by the heads)."""
        return self.conv_dim * self.conv_kernel + 2 * self.value_heads + self.value_head_dim

    def heads_per_gpu(self, tp: int) -> tuple[int, int]:
        """(key heads, value heads) on one of `tp` GPUs: vLLM splits both by tp."""
        if self.key_heads % tp:
            raise PlannerError(f"tensor parallel size {tp} does not divide the {self.key_heads} linear-attention "
                               f"key heads")
        return self.key_heads // tp, self.value_heads // tp

    @property
    def recurrent_flops(self) -> int:
        """FLOPs of one token's recurrent step, all value heads: per head the state's decay, its read by k,
        the rank-one write of the delta and the read by q, each key_head_dim x value_head_dim multiply-adds."""
        return 4 * 2 * self.value_heads * self.key_head_dim * self.value_head_dim

    def in_proj_per_gpu(self, tp: int) -> int:
        """Outputs of the input projections on one of `tp` GPUs: q, k, v, z and b, a."""
        key_heads, value_heads = self.heads_per_gpu(tp)
        return 2 * key_heads * self.key_head_dim + value_heads * (2 * self.value_head_dim + 2)

    def out_proj_inputs_per_gpu(self, tp: int) -> int:
        return self.heads_per_gpu(tp)[1] * self.value_head_dim

    def gated_norm_width_per_gpu(self, tp: int) -> int:
        """Width of the z-gated RMSNorm's input on one of `tp` GPUs."""
        return self.out_proj_inputs_per_gpu(tp)

    def state_bytes_per_gpu(self, tp: int, dtype_bytes: int) -> int:
        """One sequence's state in one layer on one of `tp` GPUs: the convolution's last conv_kernel - 1
        inputs (model dtype) and the recurrent matrices (state dtype)."""
        key_heads, value_heads = self.heads_per_gpu(tp)
        conv = (self.conv_kernel - 1) * (2 * key_heads * self.key_head_dim + value_heads * self.value_head_dim)
        recurrent = value_heads * self.key_head_dim * self.value_head_dim
        return conv * dtype_bytes + recurrent * (self.state_dtype_bytes or dtype_bytes)


def _linear_layers(get: Callable[..., Any], layers: int, name: str) -> int:
    """How many layers are Gated DeltaNet: from layer_types, else every layer but each
    full_attention_interval-th."""
    types = get("layer_types")
    if isinstance(types, list) and types:
        unknown = set(types) - {"linear_attention", "full_attention"}
        if len(types) != layers or unknown:
            raise PlannerError(f"model {name!r}: layer_types must list {layers} layers of linear_attention and "
                               f"full_attention, got {len(types)}{' with ' + ', '.join(sorted(unknown)) if unknown else ''}")
        return types.count("linear_attention")
    interval = get("full_attention_interval") or 4
    return sum(1 for layer in range(layers) if (layer + 1) % interval)


def linear_attention_fields(get: Callable[..., Any], model_type: str, name: str) -> dict[str, Any]:
    """ModelSpec keyword arguments of a Qwen3-Next or Qwen3.5 text config (`get(key, default=None)` reads it)."""
    hidden, heads, layers = get("hidden_size"), get("num_attention_heads"), get("num_hidden_layers")
    head_size = get("head_dim") or hidden // heads
    rope = get("rope_parameters") or {}
    theta = (rope.get("rope_theta") if isinstance(rope, dict) else None) or get("rope_theta") or 10000.0
    linear = LinearAttention(
        layers=_linear_layers(get, layers, name), key_heads=get("linear_num_key_heads"),
        value_heads=get("linear_num_value_heads"), key_head_dim=get("linear_key_head_dim"),
        value_head_dim=get("linear_value_head_dim"), conv_kernel=get("linear_conv_kernel_dim"),
        state_dtype_bytes=state_dtype_bytes(get("mamba_ssm_dtype"), "mamba_ssm_dtype", name))
    fields: dict[str, Any] = dict(
        name=name, model_type=model_type, num_layers=layers, hidden_size=hidden, num_heads=heads,
        num_kv_heads=get("num_key_value_heads") or heads, head_size=head_size,
        partial_rotary_dims=partial_rotary_dims(get, head_size, name), vocab_size=get("vocab_size"),
        max_position_embeddings=get("max_position_embeddings"),
        tie_word_embeddings=bool(get("tie_word_embeddings", False)), rope_theta=float(theta),
        norm_eps=get("rms_norm_eps", 1e-6), attention_bias=bool(get("attention_bias", False)),
        attention_output_gate=bool(get("attn_output_gate", True)), linear_attention=linear,
        # Qwen3.5-MoE configs name no dense width: every layer's MLP is experts
        intermediate_size=get("intermediate_size") or get("moe_intermediate_size"))
    if model_type in LINEAR_ATTENTION_MOE_TYPES:
        width = get("moe_intermediate_size")
        fields.update(num_experts=get("num_experts") or get("num_local_experts"),
                      num_experts_per_tok=get("num_experts_per_tok"), moe_intermediate_size=width,
                      dense_layers=dense_layer_count(get, layers),
                      shared_experts=shared_expert_count(width, get("shared_expert_intermediate_size") or 0, name))
    scheme = checkpoint_scheme(get("quantization_config"))
    if scheme is not None:
        fields["checkpoint_quantization"] = scheme
    return fields


def linear_attention_hf_config(spec, common: dict[str, Any]):
    """A transformers config of a Gated DeltaNet hybrid with its true shapes (random-weight checkpoints)."""
    import transformers  # slow import; only the profiler, the engine and the tests build configs

    linear = spec.linear_attention
    period = spec.num_layers // max(spec.num_layers - linear.layers, 1)
    types = ["full_attention" if (i + 1) % period == 0 else "linear_attention" for i in range(spec.num_layers)]
    fields = dict(common, layer_types=types, linear_num_key_heads=linear.key_heads,
                  linear_num_value_heads=linear.value_heads, linear_key_head_dim=linear.key_head_dim,
                  linear_value_head_dim=linear.value_head_dim, linear_conv_kernel_dim=linear.conv_kernel)
    if linear.state_dtype_bytes:
        fields["mamba_ssm_dtype"] = STATE_DTYPE_NAMES[linear.state_dtype_bytes]
    if spec.model_type == "qwen3_5_text":
        config = transformers.Qwen3_5TextConfig(**fields)
        config.architectures = ["Qwen3_5ForCausalLM"]
        return config
    moe = dict(num_experts=spec.num_experts, num_experts_per_tok=spec.num_experts_per_tok,
               moe_intermediate_size=spec.moe_intermediate_size,
               shared_expert_intermediate_size=spec.shared_experts * spec.moe_intermediate_size)
    if spec.model_type == "qwen3_next":
        config = transformers.Qwen3NextConfig(**fields, **moe)
        config.architectures = ["Qwen3NextForCausalLM"]
    else:
        config = transformers.Qwen3_5MoeTextConfig(**fields, **moe)
        config.architectures = ["Qwen3_5MoeForCausalLM"]
    return config
