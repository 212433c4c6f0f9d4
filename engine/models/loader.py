"""``load_model``: a local HF folder (config.json + safetensors) -> paged model.

A random-weight test model and a real checkpoint take the same path: the
config is read with transformers' AutoConfig, the model is built on the meta
device (no time spent on random init), materialized on the target device and
filled from the safetensors files, every parameter accounted for.
"""

from __future__ import annotations

import os

import torch
from torch import nn
from transformers import AutoConfig

try:  # transformers 5's configs are strict dataclasses: a field of the wrong type raises this, not a ValueError
    from huggingface_hub.errors import StrictDataclassError
except ImportError:  # the older huggingface_hub of transformers 4.x
    StrictDataclassError = ValueError

from engine.models.gemma3 import Gemma3ForCausalLM
from engine.models.gpt2 import GPT2LMHeadModel
from engine.models.gpt_oss import GptOssForCausalLM
from engine.models.llama import LlamaForCausalLM
from engine.models.mixtral import MixtralForCausalLM
from engine.models.opt import OPTForCausalLM
from engine.models.phi3 import Phi3ForCausalLM
from engine.models.qwen3 import Qwen3ForCausalLM
from engine.models.weights import WeightLoader, iter_safetensors, tensor_count
from engine.models.errors import UnsupportedModelError

# HF config.model_type -> our implementation.
MODEL_CLASSES: dict[str, type[nn.Module]] = {
    "llama": LlamaForCausalLM,
    "mistral": LlamaForCausalLM,
    "qwen2": LlamaForCausalLM,
    "phi3": Phi3ForCausalLM,
    "qwen3": Qwen3ForCausalLM,
    "qwen3_moe": Qwen3ForCausalLM,
    "gemma3_text": Gemma3ForCausalLM,
    "mixtral": MixtralForCausalLM,
    "gpt_oss": GptOssForCausalLM,
    "opt": OPTForCausalLM,
    "gpt2": GPT2LMHeadModel,
}

# Architectures whose sliding-window attention the engine applies (engine.models.llama and its subclasses).
SLIDING_WINDOW_MODELS = ("mistral", "qwen2", "phi3", "gemma3_text", "qwen3", "qwen3_moe", "mixtral", "gpt_oss")

DTYPE_NAMES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}


# Where "auto" runs when set: the test suite pins its tiny models (head size 16,
# which the CUDA kernels do not serve) to the CPU on a GPU host with it.
DEVICE_ENV_VAR = "PAGED_DEVICE"


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """"auto": $PAGED_DEVICE if set, else CUDA when present, else the CPU. A device this machine does not
    have is a ValueError naming it, not torch's assertion at the first tensor."""
    if device == "auto":
        device = os.environ.get(DEVICE_ENV_VAR) or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device {device!r}: choose auto, cpu or cuda") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: no CUDA device found (torch {torch.__version__} sees none); "
                         f"use cpu")
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: this engine runs on cpu or cuda")
    return resolved


def resolve_dtype(dtype: str | torch.dtype, config, device: torch.device) -> torch.dtype:
    """"auto" means the checkpoint's own dtype (fp32 if it names none).

    Exception: an fp16 checkpoint runs in fp32 on the CPU, because CPU fp16
    matmuls are slow (no native fp16 arithmetic on most CPUs) and accumulate
    less accurately. bf16 stays bf16: CPUs with AVX512-BF16/AMX run it well.
    An explicit dtype is always honoured.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype != "auto":
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"unknown dtype {dtype!r}; use 'auto' or one of {', '.join(DTYPE_NAMES)}")
        return DTYPE_NAMES[dtype]
    # transformers 5 calls it `dtype`; 4.x `torch_dtype`.
    config_dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    if isinstance(config_dtype, str):
        config_dtype = DTYPE_NAMES[config_dtype]
    if device.type == "cpu" and config_dtype == torch.float16:
        return torch.float32
    return config_dtype


def read_config(path: str | os.PathLike):
    """The transformers config of the checkpoint in `path`. One that transformers refuses (a field of the wrong
    type, RoPE settings that do not fit the model) is a ValueError naming the file, in one line."""
    try:
        return AutoConfig.from_pretrained(path, local_files_only=True)
    except StrictDataclassError as exc:
        raise ValueError(f"{os.path.join(path, 'config.json')}: {' '.join(str(exc).split())}") from None


def load_model(path: str, dtype: str | torch.dtype = "auto", device: str | torch.device = "auto"):
    """Build the paged model for the checkpoint in ``path`` and load its weights.

    Returns ``(model, config)``; the model is in eval mode on ``device`` in the
    resolved dtype (see ``resolve_dtype``). Raises for an unsupported
    architecture, an unknown checkpoint tensor, or a parameter left unfilled.
    """
    config = read_config(path)
    if config.model_type not in MODEL_CLASSES:
        raise UnsupportedModelError(
            f"model_type {config.model_type!r} is not supported ({', '.join(MODEL_CLASSES)} are)"
        )
    # Every layer has weights of its own: a config with more layers than the checkpoint has tensors is not its
    # config (a mistyped num_hidden_layers would build layers until memory runs out).
    layers = getattr(config, "num_hidden_layers", None)
    if isinstance(layers, int) and layers > (tensors := tensor_count(path)):
        raise ValueError(f"{os.path.join(path, 'config.json')}: num_hidden_layers is {layers:,} but the checkpoint "
                         f"holds {tensors:,} tensors: not this checkpoint's config")
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, config, device)
    window = getattr(config, "sliding_window", None)
    if window and config.model_type not in SLIDING_WINDOW_MODELS:
        raise UnsupportedModelError(f"model_type {config.model_type!r} with sliding_window={window} is not "
                                  f"supported (sliding windows work for {', '.join(SLIDING_WINDOW_MODELS)})")

    with torch.device("meta"):
        model = MODEL_CLASSES[config.model_type](config)
    model = model.to(dtype=dtype).to_empty(device=device).eval()

    tied = bool(getattr(config, "tie_word_embeddings", False))
    if tied:
        model.tie_lm_head()
    loader = WeightLoader(model)
    # A tied model's lm_head *is* the embedding; a checkpoint copy of it is redundant.
    model.load_weights(((n, t) for n, t in iter_safetensors(path) if not (tied and n == "lm_head.weight")), loader)
    missing = loader.missing()
    if missing == ["lm_head.weight"]:
        # Checkpoints without an output matrix reuse the input embedding.
        model.tie_lm_head()
        missing = []
    if missing:
        raise ValueError(f"checkpoint {path} lacks weights for: {', '.join(missing[:10])}"
                         + (f" (+{len(missing) - 10} more)" if len(missing) > 10 else ""))
    return model, config
