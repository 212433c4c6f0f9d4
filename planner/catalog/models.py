"""Model catalog: the true shapes of the models the planner knows, and what follows from them.

Parameter counts, weight bytes, KV bytes per token and FLOPs per token are
computed from the architecture (not copied from model cards), so a user's own
config.json gets the same treatment as a catalog entry. The catalog data lives
in planner/data/models.json.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from planner.catalog.base import Catalog
from planner.catalog.quantization import WeightFormat
from planner.errors import PlannerError

# model_type -> how its layers are built. OPT and GPT-2 are the same decoder
# block (biased linears, LayerNorm with weight+bias, learned positions; OPT
# keeps 2 extra position rows, an offset inherited from fairseq). LLaMA and
# Mistral use bias-free linears, RMSNorm (weight only), RoPE and a gated MLP.
_GPT_LIKE = {"opt": 2, "gpt2": 0}          # model_type -> learned position-table offset
_LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3")
KNOWN_TYPES = (*_GPT_LIKE, *_LLAMA_LIKE)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer's shape. Sizes are counts, not bytes, unless named *_bytes."""

    name: str
    model_type: str                 # "opt", "llama", "mistral", "qwen2", "qwen3", "gpt2"
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope_theta: float | None = None
    norm_eps: float = 1e-5
    sliding_window: int | None = None
    hf_id: str | None = None
    published_params: int | None = None
    source: str = ""
    aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.model_type not in KNOWN_TYPES:
            raise PlannerError(f"unsupported model_type {self.model_type!r}; known: {', '.join(KNOWN_TYPES)}")
        for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_size",
                      "intermediate_size", "vocab_size", "max_position_embeddings"):
            if getattr(self, field) <= 0:
                raise PlannerError(f"model {self.name!r}: {field} must be positive, got {getattr(self, field)}")
        if self.num_heads % self.num_kv_heads:
            raise PlannerError(f"model {self.name!r}: num_heads {self.num_heads} is not a multiple of "
                               f"num_kv_heads {self.num_kv_heads}")

    # ---- shapes -------------------------------------------------------------

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_size

    @property
    def kv_size(self) -> int:
        """Width of K (or V) for one token in one layer."""
        return self.num_kv_heads * self.head_size

    @property
    def is_gpt_like(self) -> bool:
        return self.model_type in _GPT_LIKE

    # ---- parameter counts ---------------------------------------------------

    @property
    def matmul_params_per_layer(self) -> int:
        """Weights of the linear layers in one block: what each token multiplies against."""
        h, i = self.hidden_size, self.intermediate_size
        attn = h * self.q_size + 2 * h * self.kv_size + self.q_size * h
        mlp = 2 * h * i if self.is_gpt_like else 3 * h * i     # gated MLP has gate, up, down
        return attn + mlp

    @property
    def linear_shapes(self) -> tuple[tuple[int, int], ...]:
        """(outputs, inputs) of each linear weight of one block: q, k, v, o, then gate, up, down (fc1, fc2)."""
        h, i, q, kv = self.hidden_size, self.intermediate_size, self.q_size, self.kv_size
        mlp = ((i, h), (h, i)) if self.is_gpt_like else ((i, h), (i, h), (h, i))
        return ((q, h), (kv, h), (kv, h), (h, q)) + mlp

    @property
    def other_params_per_layer(self) -> int:
        """Biases and norm weights of one block (small, but part of the published counts)."""
        h, i = self.hidden_size, self.intermediate_size
        if self.is_gpt_like:
            biases = self.q_size + 2 * self.kv_size + h + i + h
            return biases + 2 * (2 * h)                       # two LayerNorms, weight + bias
        qk_norms = 2 * self.head_size if self.model_type == "qwen3" else 0   # Qwen3 norms q and k per head
        qkv_bias = self.q_size + 2 * self.kv_size if self.model_type == "qwen2" else 0   # Qwen2: biased q, k, v
        return 2 * h + qk_norms + qkv_bias                    # two RMSNorms, weight only

    @property
    def position_params(self) -> int:
        if not self.is_gpt_like:
            return 0                                          # RoPE has no parameters
        return (self.max_position_embeddings + _GPT_LIKE[self.model_type]) * self.hidden_size

    @property
    def final_norm_params(self) -> int:
        return 2 * self.hidden_size if self.is_gpt_like else self.hidden_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Separate output-projection weights; 0 when tied to the input embedding."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        per_layer = self.matmul_params_per_layer + self.other_params_per_layer
        return (self.num_layers * per_layer + self.embedding_params + self.position_params
                + self.final_norm_params + self.lm_head_params)

    @property
    def replicated_params(self) -> int:
        """Parameters every tensor-parallel rank holds in full (Megatron-style sharding).

        Norms, position tables and the biases added after a row-parallel layer
        (attention output, MLP down projection) are not split; everything else
        (column/row-parallel weights, vocab-parallel embedding and LM head) is.
        """
        h = self.hidden_size
        per_layer = (2 * (2 * h) + 2 * h) if self.is_gpt_like else 2 * h
        return self.num_layers * per_layer + self.position_params + self.final_norm_params

    # ---- bytes and FLOPs ----------------------------------------------------

    def weight_bytes(self, dtype_bytes: int = 2) -> int:
        return self.num_params * dtype_bytes

    def weight_bytes_per_gpu(self, tp: int = 1, dtype_bytes: int = 2, weight_format: WeightFormat | None = None) -> int:
        """Weights one of `tp` tensor-parallel GPUs holds: its shard plus the replicated parts.

        With a `weight_format`, the blocks' linear layers are stored in it (scales included) and the
        rest (embedding, LM head, norms, biases) stays at `dtype_bytes`, as vLLM keeps them
        (planner/catalog/quantization.py); the linear layers and their scales shard by 1/tp.
        """
        if tp < 1:
            raise PlannerError(f"tensor parallel size must be >= 1, got {tp}")
        sharded = self.num_params - self.replicated_params
        if weight_format is None or not weight_format.quantizes_linear:
            return (-(-sharded // tp) + self.replicated_params) * dtype_bytes
        linear = self.num_layers * sum(weight_format.matrix_bytes(n, k) for n, k in self.linear_shapes)
        rest = sharded - self.num_layers * self.matmul_params_per_layer
        return -(-linear // tp) + (-(-rest // tp) + self.replicated_params) * dtype_bytes

    def kv_heads_per_gpu(self, tp: int) -> int:
        """KV heads one GPU stores: a 1/tp share, or one replicated head when tp exceeds the KV heads (GQA)."""
        if tp < 1:
            raise PlannerError(f"tensor parallel size must be >= 1, got {tp}")
        if self.num_heads % tp:
            raise PlannerError(f"tensor parallel size {tp} does not divide {self.name}'s {self.num_heads} "
                               f"attention heads")
        if self.num_kv_heads % tp and tp % self.num_kv_heads:
            raise PlannerError(f"tensor parallel size {tp} and {self.name}'s {self.num_kv_heads} KV heads "
                               f"do not divide")
        return max(1, self.num_kv_heads // tp)

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """K and V of one token across all layers (the paper's 800 KB for OPT-13B in fp16)."""
        return 2 * self.num_layers * self.kv_size * dtype_bytes

    def flops_per_token(self, context_len: int = 0) -> int:
        """Forward FLOPs for one token that attends to `context_len` keys, LM head included.

        2 FLOPs per weight per token for the linear layers and the LM head, plus
        QK^T and PV: 2 * 2 * head_size FLOPs per (query head, key) pair per layer.
        """
        linear = 2 * (self.num_layers * self.matmul_params_per_layer + self.vocab_size * self.hidden_size)
        attention = 4 * self.num_layers * self.q_size * context_len
        return linear + attention

    # ---- Hugging Face configs ----------------------------------------------

    def to_hf_config(self, **overrides: Any):
        """A transformers config with this model's true shapes; overrides are set afterwards.

        Overrides use config attribute names (e.g. num_hidden_layers=1 to build a
        one-layer model for per-layer profiling); an unknown name is an error, not
        a silently ignored extra attribute.
        """
        import transformers  # slow import; only the profiler and engine need configs

        if self.model_type == "opt":
            config = transformers.OPTConfig(
                vocab_size=self.vocab_size, hidden_size=self.hidden_size, num_hidden_layers=self.num_layers,
                ffn_dim=self.intermediate_size, num_attention_heads=self.num_heads,
                max_position_embeddings=self.max_position_embeddings, word_embed_proj_dim=self.hidden_size,
                do_layer_norm_before=True, enable_bias=True, tie_word_embeddings=self.tie_word_embeddings,
            )
            config.architectures = ["OPTForCausalLM"]
        elif self.model_type == "gpt2":
            config = transformers.GPT2Config(
                vocab_size=self.vocab_size, n_positions=self.max_position_embeddings, n_embd=self.hidden_size,
                n_layer=self.num_layers, n_head=self.num_heads, n_inner=self.intermediate_size,
                layer_norm_epsilon=self.norm_eps, tie_word_embeddings=self.tie_word_embeddings,
            )
            config.architectures = ["GPT2LMHeadModel"]
        else:
            common = dict(
                vocab_size=self.vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
                num_hidden_layers=self.num_layers, num_attention_heads=self.num_heads,
                num_key_value_heads=self.num_kv_heads, head_dim=self.head_size,
                max_position_embeddings=self.max_position_embeddings, rms_norm_eps=self.norm_eps,
                tie_word_embeddings=self.tie_word_embeddings,
                rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta or 10000.0},
            )
            if self.model_type == "mistral":
                config = transformers.MistralConfig(sliding_window=self.sliding_window, **common)
                config.architectures = ["MistralForCausalLM"]
            elif self.model_type == "qwen3":
                config = transformers.Qwen3Config(**common)
                config.architectures = ["Qwen3ForCausalLM"]
            elif self.model_type == "qwen2":
                config = transformers.Qwen2Config(**common)
                config.architectures = ["Qwen2ForCausalLM"]
            else:
                config = transformers.LlamaConfig(**common)
                config.architectures = ["LlamaForCausalLM"]
        for key, value in overrides.items():
            if not hasattr(config, key):
                raise PlannerError(f"unknown config field {key!r} for {type(config).__name__}")
            setattr(config, key, value)
        return config

    @classmethod
    def from_hf_config(cls, config: Any, name: str | None = None) -> "ModelSpec":
        """Describe a model from its transformers config (or the dict of its config.json)."""
        get = config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
        model_type = get("model_type")
        if name is None:
            path = get("_name_or_path") or get("name_or_path") or ""
            name = os.path.basename(str(path).rstrip("/")) or str(model_type)
        if model_type == "gpt2":
            hidden = get("n_embd")
            return cls(name=name, model_type="gpt2", num_layers=get("n_layer"), hidden_size=hidden,
                       num_heads=get("n_head"), num_kv_heads=get("n_head"), head_size=hidden // get("n_head"),
                       intermediate_size=get("n_inner") or 4 * hidden, vocab_size=get("vocab_size"),
                       max_position_embeddings=get("n_positions"),
                       tie_word_embeddings=bool(get("tie_word_embeddings", True)),
                       norm_eps=get("layer_norm_epsilon", 1e-5))
        if model_type == "opt":
            hidden = get("hidden_size")
            proj = get("word_embed_proj_dim") or hidden
            if proj != hidden or not get("do_layer_norm_before", True):
                # opt-350m: embedding projections and post-LayerNorm, a shape this catalog does not model
                raise PlannerError(f"OPT variant {name!r} (word_embed_proj_dim={proj}, post-LayerNorm) is not supported")
            heads = get("num_attention_heads")
            return cls(name=name, model_type="opt", num_layers=get("num_hidden_layers"), hidden_size=hidden,
                       num_heads=heads, num_kv_heads=heads, head_size=hidden // heads,
                       intermediate_size=get("ffn_dim"), vocab_size=get("vocab_size"),
                       max_position_embeddings=get("max_position_embeddings"),
                       tie_word_embeddings=bool(get("tie_word_embeddings", True)))
        if model_type in _LLAMA_LIKE:
            hidden, heads = get("hidden_size"), get("num_attention_heads")
            rope = get("rope_parameters") or {}
            # transformers 5 keeps rope_theta in rope_parameters; config.json files on the Hub, at the top level
            theta = (rope.get("rope_theta") if isinstance(rope, dict) else None) or get("rope_theta")
            # Qwen3 configs carry a sliding_window that is off unless use_sliding_window is set
            window = get("sliding_window") if get("use_sliding_window", True) else None
            return cls(name=name, model_type=model_type, num_layers=get("num_hidden_layers"), hidden_size=hidden,
                       num_heads=heads, num_kv_heads=get("num_key_value_heads") or heads,
                       head_size=get("head_dim") or hidden // heads,
                       intermediate_size=get("intermediate_size"), vocab_size=get("vocab_size"),
                       max_position_embeddings=get("max_position_embeddings"),
                       tie_word_embeddings=bool(get("tie_word_embeddings", False)),
                       rope_theta=float(theta or get("rope_theta") or 10000.0),
                       norm_eps=get("rms_norm_eps", 1e-6), sliding_window=window)
        raise PlannerError(f"unsupported model_type {model_type!r}; known: {', '.join(KNOWN_TYPES)}")

    @classmethod
    def from_model_dir(cls, path: str | os.PathLike) -> "ModelSpec":
        """Describe a local model folder from its config.json (no weights are read)."""
        config_path = os.path.join(path, "config.json")
        if not os.path.isfile(config_path):
            raise PlannerError(f"no config.json in model folder {str(path)!r}")
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
        name = os.path.basename(os.path.abspath(path))
        return cls.from_hf_config(config, name=name)


@lru_cache(maxsize=1)
def model_catalog() -> Catalog[ModelSpec]:
    """The model catalog (planner/data/models.json), indexed by name, aliases and Hugging Face id."""
    text = resources.files("planner").joinpath("data/models.json").read_text(encoding="utf-8")
    specs = []
    for entry in json.loads(text)["models"]:
        entry = dict(entry)
        entry["aliases"] = tuple(entry.get("aliases", ()))
        if entry.get("published_params") is not None:
            entry["published_params"] = int(entry["published_params"])
        specs.append(ModelSpec(**entry))

    def keys(spec: ModelSpec) -> list[str]:
        found = [spec.name, *spec.aliases]
        if spec.hf_id:
            found += [spec.hf_id, spec.hf_id.split("/")[-1]]
        return found

    return Catalog("model", specs, keys=keys)


def list_models() -> list[ModelSpec]:
    """All catalog entries, in file order."""
    return list(model_catalog())


# Fine-tunes and checkpoint variants keep their base model's shapes: a Hugging Face id with these words
# resolves to the catalog entry of the id without them (Mistral-7B-Instruct-v0.3 -> Mistral-7B-v0.3,
# Llama-3.1-8B-Instruct-FP8 -> Llama-3.1-8B). A quantization the id names is the deployment's business
# (--quantization), not the model's shape.
VARIANT_WORDS = frozenset(("instruct", "chat", "it", "base", "hf", "fp8", "dynamic", "fp4", "nvfp4", "mxfp4", "awq",
                           "gptq", "int4", "int8", "w8a8", "w4a16", "2507", "2407"))


def resolve_model(name: str | ModelSpec) -> ModelSpec:
    """A catalog model by name, alias or Hugging Face id (a fine-tuned or quantized variant of a catalog
    id included), or a local model folder or its config.json file."""
    if isinstance(name, ModelSpec):
        return name
    text = str(name)
    if os.path.isfile(text) and os.path.basename(text) == "config.json":
        return ModelSpec.from_model_dir(os.path.dirname(text) or ".")
    if os.path.isdir(text):
        return ModelSpec.from_model_dir(text)
    catalog = model_catalog()
    base = text.rsplit("/", 1)[-1]
    without_variant = "-".join(w for w in base.lower().split("-") if w not in VARIANT_WORDS)
    spec = catalog.find(text) or catalog.find(base) or catalog.find(without_variant)
    if spec is not None:
        return spec
    return catalog.get(text, hint=" (planner list models shows each one's Hugging Face ids; or give a model "
                                  "folder or its config.json)")


def model_ids(spec: ModelSpec) -> list[str]:
    """Every name `resolve_model` finds `spec` by: its name, aliases and Hugging Face id."""
    return list(dict.fromkeys([spec.name, *spec.aliases, *([spec.hf_id] if spec.hf_id else [])]))
