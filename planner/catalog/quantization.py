"""Weight formats vLLM serves (--quantization): bytes per weight with their scales, what a checkpoint
keeps in 16 bits, and the kernel vLLM runs each format with on a given GPU.

Which layers are quantized. vLLM's quantization configs give a quantized method only to the linear
layers of the decoder blocks (`LinearBase`: q/k/v, o, gate/up, down); the token embedding and the LM
head (`VocabParallelEmbedding` / `ParallelLMHead`), the norms and the biases stay in the activation
dtype (vllm/model_executor/layers/quantization/*.py, `get_quant_method`; the checkpoints' own configs
list lm_head under "ignore"). MXFP4 is narrower still: `Mxfp4Config.get_quant_method` returns
`UnquantizedLinearMethod` for every linear layer ("MXFP4 linear layer is not implemented") and quantizes
only fused-MoE experts, so a dense model's weights stay 16-bit under it.

Bytes of one linear weight of n outputs by k inputs, scales included, as the formats store them:
- fp8, per-tensor (vLLM's online `--quantization fp8`, ModelOpt FP8): one byte per weight, plus an fp32
  weight scale and an fp32 activation scale per matrix;
- fp8, per-channel (compressed-tensors FP8_DYNAMIC): one byte per weight plus an fp32 scale per output row;
- fp8, 128 x 128 blocks (`weight_block_size` in the config, DeepSeek/Qwen FP8): an fp32 scale per block;
- NVFP4 (ModelOpt; NVIDIA's format): two E2M1 values per byte, an FP8 E4M3 scale per 16 weights along
  k, and fp32 global weight and activation scales per matrix;
- MXFP4 (OCP Microscaling v1.0): two E2M1 values per byte and an E8M0 (one-byte) scale per 32 weights;
- AWQ / GPTQ (int4 or int8 weights in groups of `group_size` along k, 128 by default): packed integers,
  an fp16 scale per group and output, and for AWQ (asymmetric) a 4-bit zero point per group and output
  packed eight to an int32; GPTQ checkpoints are symmetric by default, which vLLM's GPTQ Marlin path
  runs without zero points; with act-order (desc_act) it keeps g_idx and its sort order, two int32 per
  input row.

ModelOpt's MIXED_PRECISION (vLLM's `modelopt_mixed`, ModelOptMixedPrecisionConfig) stores each module its
config's `quantized_layers` names in that entry's format (FP8 per tensor, NVFP4, or W4A16_NVFP4: NVFP4 weights
beside 16-bit activations, which vLLM multiplies with FP4 Marlin on every GPU), the LM head included where it is
listed, and leaves every linear layer it does not name unquantized (planner/catalog/kept_layers.py).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from typing import Any

from planner.catalog.gpus import GpuSpec
from planner.errors import PlannerError

METHODS = ("fp8", "nvfp4", "mxfp4", "awq", "gptq")
MIXED = "modelopt_mixed"     # vLLM's name for ModelOpt's MIXED_PRECISION: each layer in its own format, from the config
SCHEMES = ("fp8-tensor", "fp8-channel", "fp8-block", "nvfp4", "mxfp4", "int-group", "mixed")
EXPERT_SCHEMES = ("", "mxfp4", "nvfp4")   # a MoE's experts in their own 4-bit scheme beside FP8 layers
FP8_BLOCK = 128          # DeepSeek-style FP8 checkpoints: weight_block_size [128, 128]
INT_GROUP = 128          # AWQ and GPTQ's usual group size (AutoAWQ q_group_size, GPTQ group_size)
NVFP4_GROUP = 16         # NVFP4: one E4M3 scale per 16 values
MXFP4_GROUP = 32         # OCP MX: one E8M0 scale per 32 values


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class WeightFormat:
    """How a checkpoint stores its linear-layer weights. `source` says where the format came from."""

    method: str                  # vLLM's --quantization name
    scheme: str                  # one of SCHEMES
    bits: int = 8                # bits per weight value
    group_size: int = 0          # weights per scale along k (0: per tensor or per channel)
    zero_points: bool = False    # int formats: asymmetric (AWQ)
    act_order: bool = False      # GPTQ desc_act: g_idx kept
    source: str = "--quantization"
    # module patterns the checkpoint leaves unquantized (planner/catalog/kept_layers.py)
    excluded: tuple[str, ...] = ()
    # the MoE experts' own scheme where it differs (DeepSeek-V4 beside FP8 layers: "mxfp4" for its expert_dtype
    # fp4, "nvfp4" for ModelOpt's re-release)
    expert_scheme: str = ""
    # ModelOpt's W4A16_NVFP4: NVFP4 weights beside 16-bit activations, which vLLM multiplies weight-only (Marlin)
    weight_only: bool = False
    # modelopt_mixed: (module pattern, its format) for each entry of the config's quantized_layers; a linear
    # layer none of them names stays 16-bit (planner/catalog/kept_layers.py format_shares)
    layers: tuple[tuple[str, "WeightFormat"], ...] = ()

    def __post_init__(self) -> None:
        known = self.method in METHODS + (MIXED,) and self.scheme in SCHEMES
        if not known or self.expert_scheme not in EXPERT_SCHEMES or (self.method == MIXED) != (self.scheme == "mixed"):
            raise PlannerError(f"unknown weight format {self.method}/{self.scheme}"
                               + (f" with {self.expert_scheme} experts" if self.expert_scheme else ""))

    @property
    def is_mixed(self) -> bool:
        return self.method == MIXED

    @property
    def experts(self) -> "WeightFormat | None":
        """The format a MoE's experts are stored and multiplied in: this one, the experts' own (DeepSeek-V4's),
        or a mixed config's entry for them (None: not listed, so 16-bit)."""
        if self.is_mixed:
            return self._listed(lambda name: name.endswith(".experts") or ".experts." in name)
        if not self.expert_scheme:
            return self
        return weight_format(self.expert_scheme, source=self.source)

    @property
    def head(self) -> "WeightFormat | None":
        """The LM head's format: 16-bit (None) unless a mixed config lists lm_head (vLLM then quantizes the
        ParallelLMHead too)."""
        return self._listed(lambda name: name.split(".")[-1] == "lm_head") if self.is_mixed else None

    def _listed(self, names) -> "WeightFormat | None":
        """The format of the first quantized_layers entry whose name `names` accepts, or None."""
        return next((fmt for pattern, fmt in self.layers if names(pattern)), None)

    @property
    def formats(self) -> tuple["WeightFormat", ...]:
        """The distinct formats the linear layers are stored in: this one, or a mixed config's."""
        return tuple(dict.fromkeys(fmt for _, fmt in self.layers)) if self.is_mixed else (self,)

    @property
    def quantizes_linear(self) -> bool:
        """Whether vLLM stores a dense model's linear layers in this format (MXFP4: MoE experts only)."""
        return self.scheme != "mxfp4"

    def matrix_bytes(self, n: int, k: int) -> int:
        """Bytes of one [n, k] linear weight in this format, its scales included (module docstring)."""
        if self.is_mixed:
            raise PlannerError("a modelopt_mixed checkpoint stores each layer in its own format; size them by it")
        nk = n * k
        if self.scheme == "fp8-tensor":
            return nk + 4 + 4
        if self.scheme == "fp8-channel":
            return nk + 4 * n
        if self.scheme == "fp8-block":
            return nk + 4 * _ceil(n, FP8_BLOCK) * _ceil(k, FP8_BLOCK)
        if self.scheme == "nvfp4":
            return nk // 2 + nk // NVFP4_GROUP + 4 + 4
        if self.scheme == "mxfp4":
            return nk // 2 + nk // MXFP4_GROUP
        groups = _ceil(k, self.group_size)
        return (nk * self.bits // 8 + 2 * n * groups + (n * groups // 2 if self.zero_points else 0)
                + (8 * k if self.act_order else 0))

    def bytes_per_weight(self, n: int = 4096, k: int = 4096) -> float:
        return self.matrix_bytes(n, k) / (n * k)

    def scales(self) -> str:
        """How the format scales its values, in a few words."""
        if self.is_mixed:
            return "per layer: " + ", ".join(f"{f.name} ({f.scales()})" for f in self.formats)
        return {"fp8-tensor": "per-tensor scales", "fp8-channel": "per-channel scales",
                "fp8-block": f"{FP8_BLOCK}x{FP8_BLOCK} block scales",
                "nvfp4": f"E4M3 scale per {NVFP4_GROUP}", "mxfp4": f"E8M0 scale per {MXFP4_GROUP}",
                "int-group": f"int{self.bits}, group {self.group_size}"
                             + (", zero points" if self.zero_points else "")
                             + (", act-order" if self.act_order else "")}[self.scheme]

    @property
    def name(self) -> str:
        """vLLM's name, with ModelOpt's W4A16 where the activations stay 16-bit."""
        return self.method + (" W4A16" if self.weight_only else "")

    def describe(self) -> str:
        kept = f"; {len(self.excluded)} module patterns kept in 16 bits" if self.excluded else ""
        experts = f"; experts in {self.expert_scheme} ({self.experts.scales()})" if self.expert_scheme else ""
        head = f"; lm_head in {self.head.name}" if self.head is not None else ""
        return f"{self.name} ({self.scales()}{experts}{head}{kept}; from {self.source})"

    def as_dict(self) -> dict:
        if self.is_mixed:
            return {"method": self.method, "scheme": self.scheme, "source": self.source,
                    "excluded_modules": len(self.excluded), "quantized_layers": len(self.layers),
                    "formats": [f.as_dict() for f in self.formats]}
        return {"method": self.method, "scheme": self.scheme, "bits": self.bits, "group_size": self.group_size,
                "bytes_per_weight": round(self.bytes_per_weight(), 6), "source": self.source,
                "excluded_modules": len(self.excluded),
                **({"expert_scheme": self.expert_scheme} if self.expert_scheme else {}),
                **({"weight_only": True} if self.weight_only else {})}


def weight_format(method: str, source: str = "--quantization") -> WeightFormat:
    """The format `--quantization method` means when the checkpoint does not say more (vLLM's online
    FP8 is per-tensor; AWQ and GPTQ are int4 in groups of 128, AWQ with zero points)."""
    formats = {
        "fp8": WeightFormat("fp8", "fp8-tensor"),
        "nvfp4": WeightFormat("nvfp4", "nvfp4", bits=4, group_size=NVFP4_GROUP),
        "mxfp4": WeightFormat("mxfp4", "mxfp4", bits=4, group_size=MXFP4_GROUP),
        "awq": WeightFormat("awq", "int-group", bits=4, group_size=INT_GROUP, zero_points=True),
        "gptq": WeightFormat("gptq", "int-group", bits=4, group_size=INT_GROUP),
    }
    if method == MIXED:
        raise PlannerError(f"quantization {MIXED} stores each layer in the format its checkpoint's config lists "
                           f"(quantized_layers); give the checkpoint (a model folder or an id on record), not the name")
    if method not in formats:
        raise PlannerError(f"quantization {method!r} is not supported; choose one of {', '.join(METHODS)}")
    return replace(formats[method], source=source)


def _compressed_tensors(qc: dict, source: str) -> WeightFormat:
    """compressed-tensors (llm-compressor): the weights' scheme of its first config group."""
    groups = qc.get("config_groups") or {}
    weights = next((g.get("weights") for g in groups.values() if isinstance(g, dict) and g.get("weights")), None)
    if not weights:
        raise PlannerError(f"{source}: a compressed-tensors config without a weights scheme")
    bits, kind, strategy = weights.get("num_bits"), weights.get("type"), weights.get("strategy")
    if bits == 8 and kind == "float":
        scheme = {"tensor": "fp8-tensor", "channel": "fp8-channel", "block": "fp8-block"}.get(strategy)
        if scheme:
            return WeightFormat("fp8", scheme, source=source)
    if bits == 4 and kind == "float" and weights.get("group_size") == NVFP4_GROUP:
        return WeightFormat("nvfp4", "nvfp4", bits=4, group_size=NVFP4_GROUP, source=source)
    if bits in (4, 8) and kind == "int" and strategy == "group":
        # W4A16 / W8A16: vLLM runs them on the same Marlin kernel as GPTQ
        return WeightFormat("gptq", "int-group", bits=bits, group_size=int(weights.get("group_size") or INT_GROUP),
                            zero_points=not weights.get("symmetric", True), source=source)
    raise PlannerError(f"{source}: compressed-tensors weights of {bits} bits {kind} ({strategy}) are not a "
                       f"format the planner knows ({', '.join(METHODS)})")


def _modelopt(section: dict[str, Any], source: str) -> WeightFormat:
    """A ModelOpt config (config.json's quantization_config, or hf_quant_config.json's `quantization`)."""
    algo = str(section.get("quant_algo")).upper()
    if algo == "MIXED_PRECISION":
        return mixed_format(section.get("quantized_layers"), source)
    return _modelopt_layer(section, source)


def _modelopt_layer(entry: dict[str, Any], source: str) -> WeightFormat:
    """The format of one ModelOpt quant_algo (vLLM's ModelOptFp8Config per-tensor FP8, ModelOptNvFp4Config)."""
    algo = str(entry.get("quant_algo")).upper()
    if algo == "FP8":
        return WeightFormat("fp8", "fp8-tensor", source=source)
    if algo in ("NVFP4", "W4A16_NVFP4") and entry.get("group_size", NVFP4_GROUP) == NVFP4_GROUP:
        return WeightFormat("nvfp4", "nvfp4", bits=4, group_size=NVFP4_GROUP, weight_only=algo == "W4A16_NVFP4",
                            source=source)
    raise PlannerError(f"{source}: ModelOpt quant_algo {entry.get('quant_algo')!r}"
                       + (f" with group_size {entry['group_size']}" if "group_size" in entry else "")
                       + " is not a format the planner knows (FP8, NVFP4, W4A16_NVFP4 in groups of 16, "
                         "MIXED_PRECISION of them)")


def mixed_format(listed: Any, source: str) -> WeightFormat:
    """ModelOpt's MIXED_PRECISION, as vLLM's ModelOptMixedPrecisionConfig (`modelopt_mixed`) reads it: each
    entry of `quantized_layers` in its own format, any linear layer it does not list unquantized."""
    if not isinstance(listed, dict) or not listed:
        # vLLM's words
        raise PlannerError(f"{source}: MIXED_PRECISION quant_algo requires a non-empty 'quantized_layers' mapping")
    layers = []
    for name, entry in listed.items():
        if not isinstance(entry, dict):
            raise PlannerError(f"{source}: quantized_layers[{name!r}] must be an object with a quant_algo")
        layers.append((name, _modelopt_layer(entry, source)))
    return WeightFormat(MIXED, "mixed", bits=0, source=source, layers=tuple(layers))


def format_from_config(qc: dict[str, Any], source: str = "config.json quantization_config") -> WeightFormat:
    """The weight format a checkpoint's `quantization_config` (or ModelOpt's hf_quant_config.json) declares,
    read as vLLM's configs read it (Fp8Config, ModelOptFp8Config/ModelOptNvFp4Config, AWQConfig,
    GPTQConfig, Mxfp4Config, CompressedTensorsConfig), with the modules it leaves unquantized."""
    return replace(_declared_format(qc, source), excluded=excluded_modules(qc, source))


def excluded_modules(qc: dict[str, Any], source: str) -> tuple[str, ...]:
    """The module patterns a quantization config leaves unquantized: ModelOpt's exclude_modules,
    compressed-tensors' ignore, vLLM's Fp8Config ignored_layers, Hugging Face's modules_to_not_convert
    (planner/catalog/kept_layers.py)."""
    section = qc.get("quantization") if "quantization" in qc and "quant_method" not in qc else qc
    keys = ("exclude_modules", "ignore", "ignored_layers", "modules_to_not_convert")
    if str(qc.get("quant_method", "")).lower() == "fp8":
        # vLLM's Fp8Config reads these two only; DeepSeek-V4's NVFP4 re-release lists its FP8 layers (those it
        # left out of NVFP4) under `ignore`
        keys = ("ignored_layers", "modules_to_not_convert")
    patterns = []
    for key in keys:
        value = (section or {}).get(key) or []
        if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
            raise PlannerError(f"{source}: {key} must be a list of module names")
        patterns += value
    return tuple(dict.fromkeys(patterns))


def _declared_format(qc: dict[str, Any], source: str) -> WeightFormat:
    if "quantization" in qc and "quant_method" not in qc:          # hf_quant_config.json
        return _modelopt(qc["quantization"] or {}, source)
    method = str(qc.get("quant_method", "")).lower()
    if str(qc.get("quant_algo", "")).upper() == "MIXED_PRECISION" and method != "fp8":
        # ModelOpt's per-layer formats, whatever quant_method says: vLLM's ModelOptMixedPrecisionConfig
        # overrides it (override_quantization_method); DeepSeek-V4's fp8 ones are its own (_v4_expert_scheme)
        return _modelopt(qc, source)
    if method == "fp8":
        block = qc.get("weight_block_size")
        return WeightFormat("fp8", "fp8-block" if block else "fp8-tensor", source=source,
                            expert_scheme=_v4_expert_scheme(qc, source))
    if method == "modelopt":
        return _modelopt(qc, source)
    if method == "mxfp4":
        return WeightFormat("mxfp4", "mxfp4", bits=4, group_size=MXFP4_GROUP, source=source)
    if method == "awq":
        return WeightFormat("awq", "int-group", bits=int(qc.get("bits", qc.get("w_bit", 4))),
                            group_size=int(qc.get("group_size", qc.get("q_group_size", INT_GROUP))),
                            zero_points=bool(qc.get("zero_point", True)), source=source)
    if method == "gptq":
        group = int(qc.get("group_size", INT_GROUP))
        return WeightFormat("gptq", "int-group", bits=int(qc.get("bits", 4)), group_size=max(0, group),
                            zero_points=not qc.get("sym", True), act_order=bool(qc.get("desc_act", False)),
                            source=source)
    if method == "compressed-tensors":
        return _compressed_tensors(qc, source)
    raise PlannerError(f"{source}: quant_method {method or None!r} is not one the planner knows (fp8, modelopt, "
                       f"compressed-tensors, awq, gptq, mxfp4)")


def _v4_expert_scheme(qc: dict[str, Any], source: str) -> str:
    """DeepSeek-V4's routed experts beside its FP8 layers, as vLLM's DeepseekV4 quantization config picks their
    method (vllm/models/deepseek_v4/quant_config.py): `expert_dtype` fp4 stores them in MXFP4 (Mxfp4MoEMethod),
    or in NVFP4 where `moe_quant_algo` says so (ModelOpt's re-release, quant_algo MIXED_PRECISION:
    ModelOptNvFp4FusedMoE); the other linear layers stay block FP8 either way. "" for other FP8 checkpoints."""
    algo = str(qc.get("moe_quant_algo") or "").upper()
    mixed = str(qc.get("quant_algo", "")).upper() == "MIXED_PRECISION"
    if qc.get("expert_dtype") == "fp4" and (algo == "NVFP4" or not (algo or mixed)):
        return "nvfp4" if algo else "mxfp4"
    if mixed or algo:
        raise PlannerError(f"{source}: FP8 layers beside experts of moe_quant_algo {algo or None!r} and expert_dtype "
                           f"{qc.get('expert_dtype')!r} are not a format the planner knows (DeepSeek-V4's "
                           f"expert_dtype fp4, in MXFP4 or with moe_quant_algo NVFP4)")
    return ""


# The quantization_config each catalog `checkpoint_quantization` name stands for (`checkpoint_scheme` below
# reads it back): gpt-oss's MXFP4 experts, MiniMax-M2.5's FP8 in 128 x 128 blocks, DeepSeek-V4's FP8 blocks
# beside MXFP4 experts.
CHECKPOINT_CONFIGS = {"mxfp4": {"quant_method": "mxfp4"},
                      "fp8-block": {"quant_method": "fp8", "weight_block_size": [128, 128]},
                      "fp8-block+mxfp4-experts": {"quant_method": "fp8", "weight_block_size": [128, 128],
                                                  "expert_dtype": "fp4"}}


def catalog_checkpoint_format(scheme: str, source: str) -> WeightFormat:
    """The weight format of a catalog model's released checkpoint (its `checkpoint_quantization`)."""
    return format_from_config(CHECKPOINT_CONFIGS[scheme], source=source)


def with_expert_dtype(qc: Any, expert_dtype: Any) -> Any:
    """A quantization_config with the experts' dtype a DeepSeek-V4 config.json keeps beside it, at its top level
    (transformers 5 moves it inside), folded in; `qc` as it is otherwise."""
    if isinstance(qc, dict) and expert_dtype and "expert_dtype" not in qc:
        return {**qc, "expert_dtype": expert_dtype}
    return qc


def checkpoint_scheme(qc: Any) -> str | None:
    """The catalog's name for the format a config.json's quantization_config declares, where it is one of
    CHECKPOINT_CONFIGS (gpt-oss's MXFP4, MiniMax-M2.5's block FP8), else None."""
    if not isinstance(qc, dict) or str(qc.get("quant_method", "")).lower() not in ("mxfp4", "fp8"):
        return None
    fmt = format_from_config(qc)
    scheme = fmt.scheme + (f"+{fmt.expert_scheme}-experts" if fmt.expert_scheme else "")
    return scheme if scheme in CHECKPOINT_CONFIGS else None


def checkpoint_format(model: str) -> WeightFormat | None:
    """The format a local model folder (or its config.json) declares, or None (16-bit, or not a folder)."""
    if os.path.isfile(model) and model.endswith(".json"):           # the config file itself
        folder, config_path = os.path.dirname(model) or ".", model
    elif os.path.isdir(model):
        folder, config_path = model, os.path.join(model, "config.json")
    else:
        return None
    modelopt_path = os.path.join(folder, "hf_quant_config.json")
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
        qc = with_expert_dtype(config.get("quantization_config"), config.get("expert_dtype"))
        if qc:
            return format_from_config(qc)
        if os.path.isfile(modelopt_path):
            with open(modelopt_path, encoding="utf-8") as f:
                return format_from_config(json.load(f), source="hf_quant_config.json")
    except (OSError, json.JSONDecodeError, AttributeError) as exc:
        raise PlannerError(f"{folder}: cannot read its quantization config ({exc})") from None
    return None


# Words of a Hugging Face id that name a checkpoint's weight format (RedHatAI's "-FP8-dynamic" is
# compressed-tensors FP8 with per-channel weight scales; "-w4a16"/"-int4" are int4 group checkpoints).
ID_WORDS = {"fp8": "fp8", "nvfp4": "nvfp4", "fp4": "nvfp4", "mxfp4": "mxfp4", "awq": "awq", "gptq": "gptq",
            "w4a16": "gptq", "int4": "gptq"}


# Publishers whose "-FP8" releases all store 128 x 128 block-scaled FP8 (as their configs' weight_block_size
# says), so an id of theirs not on record (Qwen/Qwen3-235B-A22B-Instruct-2507-FP8) is that, not per-tensor FP8.
BLOCK_FP8_PUBLISHERS = {
    "qwen": "Qwen's FP8 model cards: fine-grained FP8 quantization with a block size of 128",
    "deepseek-ai": "DeepSeek's FP8 releases: 128 x 128 block scales (weight_block_size)",
}


def format_from_id(model: str) -> WeightFormat | None:
    """The format a Hugging Face id's name says (nvidia/Llama-3.1-8B-Instruct-FP8 -> fp8), or None."""
    words = os.path.basename(str(model).rstrip("/")).lower().replace("_", "-").split("-")
    method = next((ID_WORDS[w] for w in words if w in ID_WORDS), None)
    if method is None:
        return None
    fmt = weight_format(method, source=f"the model id {model}")
    publisher = str(model).split("/")[0].lower() if "/" in str(model) else ""
    if method == "fp8" and publisher in BLOCK_FP8_PUBLISHERS:
        return replace(fmt, scheme="fp8-block", source=f"the model id {model} ({BLOCK_FP8_PUBLISHERS[publisher]})")
    return replace(fmt, scheme="fp8-channel") if method == "fp8" and "dynamic" in words else fmt


def recorded_format(model: str) -> WeightFormat | None:
    """The format a released checkpoint's config declares, with the modules it keeps in 16 bits, where the
    checkpoint is on record by its Hugging Face id (planner/data/checkpoint_formats.json, kept by
    scripts/extract_checkpoint_formats.py); else None."""
    record = _checkpoint_records().get(str(model).lower())
    if record is None:
        return None
    source = f"{model}'s config ({record['source']})"
    if record["method"] == MIXED:
        return replace(mixed_format(record["quantized_layers"], source), excluded=tuple(record["exclude_modules"]))
    return WeightFormat(record["method"], record["scheme"], bits=record["bits"], group_size=record["group_size"],
                        excluded=tuple(record["exclude_modules"]), expert_scheme=record.get("expert_scheme", ""),
                        source=source)


@lru_cache(maxsize=1)
def _checkpoint_records() -> dict[str, dict]:
    """Released checkpoints' declared formats by lower-cased Hugging Face id."""
    text = resources.files("planner").joinpath("data/checkpoint_formats.json").read_text(encoding="utf-8")
    return {model_id.lower(): record for model_id, record in json.loads(text)["checkpoints"].items()}


@dataclass(frozen=True)
class GemmPath:
    """What vLLM runs a format's linear layers with on one GPU: `precision` is the tensor-core math
    ("fp8", "fp4": W8A8 / W4A4 on native units; "16-bit": the weights are widened inside the kernel, or
    not quantized at all); `warning` says where vLLM departs from the format's native path."""

    precision: str
    kernel: str
    warning: str | None = None


# vLLM's words when a GPU lacks the tensor cores (marlin_utils_fp8.py / marlin_utils_fp4.py).
_NO_NATIVE = "Your GPU does not have native support for {} computation but {} quantization is being used"


def _weight_only(fmt: WeightFormat, gpu: GpuSpec, math: str) -> GemmPath:
    kernel = f"{math} Marlin (W{fmt.bits}A16, weight-only)"
    if gpu.kind != "gpu":
        return GemmPath("16-bit", f"weight-only ({fmt.bits}-bit weights widened to 16 bits)",
                        f"{gpu.name} has no {math} matrix units: {fmt.method} priced weight-only, matmuls in 16 bits")
    return GemmPath("16-bit", kernel, f"{gpu.name} has no {math} tensor cores: vLLM runs {fmt.method} weight-only "
                                      f"through its {kernel} kernel, as it warns ('{_NO_NATIVE.format(math, math)}'): "
                                      f"weights stay {fmt.bits}-bit in memory, matmuls run in 16 bits; priced so")


def gemm_path(fmt: WeightFormat, gpu: GpuSpec) -> GemmPath:
    """The kernel vLLM picks for `fmt` on `gpu`: native FP8 on Ada, Hopper and Blackwell (compute
    capability 8.9+), else FP8 Marlin (vLLM's docs: "Ampere GPUs are supported for W8A16 (weight-only
    FP8) utilizing Marlin kernels"); native NVFP4 on Blackwell, else FP4 Marlin; AWQ and GPTQ on their
    Marlin W4A16 kernels (vLLM converts them to awq_marlin / gptq_marlin on compute capability 8.0+);
    MXFP4 leaves a dense model's linear layers unquantized. ModelOpt's W4A16_NVFP4 keeps 16-bit activations, so
    vLLM runs FP4 Marlin on every GPU (ModelOptMixedPrecisionConfig's w4a16_nvfp4_config); a mixed checkpoint's
    layers each take their own format's path."""
    if fmt.is_mixed:
        paths = [gemm_path(f, gpu) for f in fmt.formats]
        return GemmPath("mixed", "; ".join(dict.fromkeys(p.kernel for p in paths)),
                        "; ".join(dict.fromkeys(p.warning for p in paths if p.warning)) or None)
    if fmt.weight_only:
        return GemmPath("16-bit", "FP4 Marlin (W4A16, weight-only, as the checkpoint asks)")
    if fmt.method == "fp8":
        if gpu.fp8_flops > 0:
            kernel = "FP8 block-scaled GEMM (W8A8)" if fmt.scheme == "fp8-block" else "CUTLASS FP8 scaled-mm (W8A8)"
            return GemmPath("fp8", kernel)
        return _weight_only(fmt, gpu, "FP8")
    if fmt.method == "nvfp4":
        return GemmPath("fp4", "NVFP4 GEMM (W4A4)") if gpu.fp4_flops > 0 else _weight_only(fmt, gpu, "FP4")
    if fmt.method == "mxfp4":
        return GemmPath("16-bit", "unquantized (MXFP4 covers MoE experts only)",
                        "vLLM's MXFP4 quantizes only fused-MoE experts (Mxfp4Config runs every linear layer "
                        "unquantized); a dense model's weights stay 16-bit")
    name = "AWQ" if fmt.method == "awq" else "GPTQ"
    return GemmPath("16-bit", f"{name} Marlin (W{fmt.bits}A16)")


def peak_flops(fmt: WeightFormat | None, gpu: GpuSpec, dtype_bytes: int = 2) -> float:
    """The tensor-core FLOP/s a layer in `fmt` is multiplied at on `gpu`: FP8 or FP4 where vLLM runs them
    natively (gemm_path), else the 16-bit peak (weight-only kernels, unquantized layers); one format, not a mix."""
    precision = gemm_path(fmt, gpu).precision if fmt is not None else "16-bit"
    if precision == "mixed":
        raise PlannerError("a modelopt_mixed checkpoint's layers have no one peak; price each in its own format")
    return {"fp8": gpu.fp8_flops, "fp4": gpu.fp4_flops}.get(precision) or gpu.peak_flops(dtype_bytes)
