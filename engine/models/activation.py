"""The FFN activations named by HF configs (``activation_function`` / ``hidden_act``)."""

from __future__ import annotations

import functools

import torch.nn.functional as F
from engine.models.errors import UnsupportedModelError

ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,  # exact erf form
    # GPT-2's "gelu_new" is the tanh approximation, which torch implements natively.
    "gelu_new": functools.partial(F.gelu, approximate="tanh"),
    "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh"),
    "silu": F.silu,
    "swish": F.silu,
}


def activation(name: str):
    if name not in ACTIVATIONS:
        raise UnsupportedModelError(f"activation {name!r} is not supported ({', '.join(ACTIVATIONS)} are)")
    return ACTIVATIONS[name]
