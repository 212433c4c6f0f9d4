"""Multi-LoRA serving: PEFT adapters applied per token beside the base model's linear layers, as vLLM does.

A request names its adapter with a ``LoRARequest`` (vLLM's fields). The engine loads each adapter
folder once per ``lora_int_id`` (``adapter_config.json`` and ``adapter_model.safetensors``, PEFT's
format) and keeps it in host memory; a step's adapters (at most ``max_loras``, the scheduler's
guarantee) are held on the device, least recently used evicted first. Before each forward pass
the runner sets the step's token -> adapter mapping on the model (``LoRAManager.applied``, as
vLLM's punica wrapper is set per step), and every targeted linear layer adds, for the tokens x of
adapter i, ``scaling_i * (x @ A_i^T) @ B_i^T`` to its output; base-model tokens are untouched.
Where the engine fuses projections (q/k/v, gate/up), each slice gets its own A and B: the model
says which rows of which module each HF module is (``lora_modules()`` in engine/models).

Nothing here runs unless LoRA is enabled: without it the model has no hooks at all.
"""
from __future__ import annotations

import json
import math
import os
import re
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from engine.models.loader import MODEL_CLASSES

ADAPTER_CONFIG = "adapter_config.json"
# PEFT's weight files, safetensors first (what save_pretrained writes by default).
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
# A PEFT key: "base_model.model.<HF module>.lora_A.weight" (older exports may keep the adapter's name
# before ".weight").
LORA_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<part>[AB])(?:\.[^.]+)?\.weight$")


@dataclass(frozen=True)
class LoRARequest:
    """vLLM's LoRARequest: an adapter's name (for people), its id (the engine's key for it; 0 is the base
    model, so ids start at 1) and its local PEFT folder."""

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"LoRA adapter {self.lora_name!r}: lora_int_id must be an integer >= 1 (0 is the "
                             f"base model), got {self.lora_int_id!r}")


@dataclass
class LayerLoRA:
    """One adapter on one of the engine's linear modules: every targeted slice's A stacked (one shrink
    matmul for q, k and v together) and, per slice, its output rows, its rows of the stack, and B
    already multiplied by the adapter's scaling."""

    a: torch.Tensor                                            # [sum of the slices' ranks, in_features]
    slices: list[tuple[int, int, int, int, torch.Tensor]]      # (row, row end, rank start, rank end, s * B)

    def to(self, device: torch.device, dtype: torch.dtype) -> LayerLoRA:
        return LayerLoRA(self.a.to(device, dtype),
                         [(r0, r1, k0, k1, b.to(device, dtype)) for r0, r1, k0, k1, b in self.slices])

    def add_to(self, output: torch.Tensor, x: torch.Tensor, rows: torch.Tensor | None) -> None:
        """output[rows] += the adapter's delta for x[rows] (every row when ``rows`` is None)."""
        xs = x if rows is None else x.index_select(0, rows)
        shrunk = xs @ self.a.T
        for r0, r1, k0, k1, b in self.slices:
            delta = shrunk[:, k0:k1] @ b.T
            if rows is None:
                output[:, r0:r1] += delta
            else:
                output[:, r0:r1].index_add_(0, rows, delta)


@dataclass
class LoRAAdapter:
    """A loaded adapter, in host memory: its weights by the engine module they apply to."""

    request: LoRARequest
    rank: int
    layers: dict[str, LayerLoRA]

    def to(self, device: torch.device, dtype: torch.dtype) -> dict[str, LayerLoRA]:
        return {name: layer.to(device, dtype) for name, layer in self.layers.items()}


# -- loading a PEFT folder --------------------------------------------------------------------------------
def _fail(request: LoRARequest, why: str) -> ValueError:
    return ValueError(f"LoRA adapter {request.lora_name!r} ({request.lora_path}): {why}")


def _read_config(request: LoRARequest, max_lora_rank: int, targets: set[str]) -> tuple[int, float]:
    """The adapter's rank and scaling from adapter_config.json, refusing what the engine does not apply."""
    path = Path(request.lora_path, ADAPTER_CONFIG)
    if not path.is_file():
        raise _fail(request, f"no {ADAPTER_CONFIG} (not a PEFT adapter folder)")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise _fail(request, f"{ADAPTER_CONFIG} is not readable JSON ({exc})") from None
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise _fail(request, f"peft_type {peft_type!r} is not LoRA")
    refused = {
        "use_dora": "DoRA (use_dora) is not supported",
        "modules_to_save": f"modules_to_save {config.get('modules_to_save')} is not supported (whole trained "
                           f"modules beside the adapter)",
        "rank_pattern": "per-module ranks (rank_pattern) are not supported",
        "alpha_pattern": "per-module alphas (alpha_pattern) are not supported",
        "lora_bias": "LoRA biases (lora_bias) are not supported",
    }
    for key, why in refused.items():
        if config.get(key):
            raise _fail(request, why)
    if config.get("bias", "none") != "none":
        raise _fail(request, f"bias {config['bias']!r} is not supported (only 'none' is)")
    r, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(r, int) or r < 1 or not isinstance(alpha, (int, float)):
        raise _fail(request, f"{ADAPTER_CONFIG} needs an integer r >= 1 and a lora_alpha, got r={r!r}, "
                             f"lora_alpha={alpha!r}")
    if r > max_lora_rank:
        raise _fail(request, f"LoRA rank {r} is greater than max_lora_rank {max_lora_rank}")
    wanted = config.get("target_modules")
    # A list names modules by their last part (or a longer suffix of their path, as PEFT matches them); a
    # string is PEFT's regex (or "all-linear"): the weights the folder holds then say what it targets.
    unknown = sorted({name.rsplit(".", 1)[-1] for name in wanted} - targets) if isinstance(wanted, list) else []
    if unknown:
        raise _fail(request, f"target modules {', '.join(unknown)} cannot be applied by this engine to this "
                             f"model (it applies LoRA to {', '.join(sorted(targets))})")
    # fan_in_fan_out only says how a Conv1D base layer (GPT-2's) stores its weight; PEFT itself turns it
    # off for nn.Linear layers, and every module the engine adapts is one, so A and B read the same.
    scaling = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
    return r, scaling


def _read_weights(request: LoRARequest) -> dict[str, torch.Tensor]:
    folder = Path(request.lora_path)
    for name in WEIGHT_FILES:
        path = folder / name
        if not path.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                return load_file(str(path))
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:   # noqa: BLE001 - either library's own error: not a weight file
            raise _fail(request, f"{name} is not readable ({' '.join(str(exc).split())})") from None
    raise _fail(request, f"no adapter weights ({' or '.join(WEIGHT_FILES)})")


def _pairs(request: LoRARequest, weights: dict[str, torch.Tensor],
           modules: dict[str, tuple[str, int, int]]) -> dict[str, dict[str, torch.Tensor]]:
    """{HF module: {"A": tensor, "B": tensor}}, every key accounted for."""
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in weights.items():
        match = LORA_KEY.match(key)
        if match is None:
            raise _fail(request, f"tensor {key} is not a LoRA A or B weight (embedding LoRA, lora_bias, DoRA "
                                 f"magnitudes and saved modules are not supported)")
        module = match["module"]
        if module not in modules:
            raise _fail(request, f"module {module} cannot be applied by this engine to this model")
        pairs.setdefault(module, {})[match["part"]] = tensor
    if not pairs:
        raise _fail(request, "the adapter holds no LoRA weights")
    for module, pair in pairs.items():
        if len(pair) != 2:
            raise _fail(request, f"module {module} has lora_{'A' if 'A' in pair else 'B'} without its other half")
    return pairs


def load_adapter(request: LoRARequest, model: nn.Module, modules: dict[str, tuple[str, int, int]],
                 max_lora_rank: int) -> LoRAAdapter:
    """Read the PEFT folder of ``request`` for ``model`` (whose ``lora_modules()`` is ``modules``): its
    weights grouped by the engine module they apply to, in fp32 on the host."""
    if not Path(request.lora_path).is_dir():
        raise _fail(request, "no such folder")
    targets = {name.rsplit(".", 1)[-1] for name in modules}
    rank, scaling = _read_config(request, max_lora_rank, targets)
    pairs = _pairs(request, _read_weights(request), modules)
    grouped: dict[str, list[tuple[int, int, torch.Tensor, torch.Tensor]]] = {}
    for hf_name, pair in pairs.items():
        own, row, rows = modules[hf_name]
        a, b = pair["A"].float(), pair["B"].float()
        in_features = model.get_submodule(own).in_features
        if a.shape != (rank, in_features) or b.shape != (rows, rank):
            raise _fail(request, f"module {hf_name}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not "
                                 f"fit (expected ({rank}, {in_features}) and ({rows}, {rank}))")
        grouped.setdefault(own, []).append((row, rows, a, b * scaling))
    layers = {}
    for own, parts in grouped.items():
        slices = [(row, row + rows, i * rank, (i + 1) * rank, b) for i, (row, rows, _, b) in enumerate(parts)]
        layers[own] = LayerLoRA(torch.cat([a for _, _, a, _ in parts]), slices)
    return LoRAAdapter(request, rank, layers)


# -- applying adapters in a step --------------------------------------------------------------------------
# A step's adapters as the hooked layers read them: (the rows of the adapter's tokens in the packed batch,
# or None for every row; the adapter's weights on the device, by engine module).
StepLoRAs = list[tuple[torch.Tensor | None, dict[str, LayerLoRA]]]


def write_random_adapter(model: nn.Module, folder: str | Path, rank: int, seed: int = 0) -> str:
    """A PEFT adapter folder of `rank` on every module ``model.lora_modules()`` names, with random nonzero A
    and B (a trained adapter's B is not zero, PEFT's initial one is): what a profile times and a validation
    of a random-weight model serves, as the model's own weights are random."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for hf_name, (own, _, rows) in sorted(model.lora_modules().items()):
        key = f"base_model.model.{hf_name}"
        inputs = model.get_submodule(own).in_features
        weights[f"{key}.lora_A.weight"] = torch.randn(rank, inputs, generator=gen) * 0.05
        weights[f"{key}.lora_B.weight"] = torch.randn(rows, rank, generator=gen) * 0.05
    save_file(weights, str(folder / WEIGHT_FILES[0]))
    targets = sorted({name.rsplit(".", 1)[-1] for name in model.lora_modules()})
    (folder / ADAPTER_CONFIG).write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank, "target_modules": targets,
        "lora_dropout": 0.0, "bias": "none", "use_rslora": False, "use_dora": False}))
    return str(folder)


class LoRAContext:
    """The current step's adapters, shared by every hooked layer of one model; None outside a step that
    runs an adapter."""

    __slots__ = ("step",)

    def __init__(self) -> None:
        self.step: StepLoRAs | None = None


class LoRAHook:
    """A forward hook on one of the engine's linear modules: adds each adapter's delta to the rows of
    its tokens. A hook, not a wrapping module: parameter names (and the CUDA graphs captured without
    an adapter) stay as they are."""

    def __init__(self, name: str, context: LoRAContext) -> None:
        self.name, self.context = name, context

    def __call__(self, module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor):
        step = self.context.step
        if step is None:
            return None
        for rows, layers in step:
            layer = layers.get(self.name)
            if layer is not None:
                layer.add_to(output, inputs[0], rows)
        return output


def supported_models() -> list[str]:
    """The model types whose models say which of their layers take adapters (``lora_modules``)."""
    return [kind for kind, cls in MODEL_CLASSES.items() if hasattr(cls, "lora_modules")]


def _hooked_context(model: nn.Module, engine_modules: set[str]) -> LoRAContext:
    """The model's LoRA context, its layers hooked the first time (runners sharing a model share them)."""
    context = getattr(model, "lora_context", None)
    if context is None:
        context = LoRAContext()
        for name in sorted(engine_modules):
            model.get_submodule(name).register_forward_hook(LoRAHook(name, context))
        model.lora_context = context
    return context


class LoRAManager:
    """A runner's adapters: every one loaded so far in host memory (by lora_int_id), up to ``max_loras`` of
    them on the device, and the per-step mapping of tokens to adapters."""

    def __init__(self, model: nn.Module, device: torch.device, dtype: torch.dtype, max_loras: int,
                 max_lora_rank: int) -> None:
        if not hasattr(model, "lora_modules"):
            model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
            raise ValueError(f"LoRA adapters are not supported for model_type {model_type!r} (they are for "
                             f"{', '.join(supported_models())})")
        self.model, self.device, self.dtype = model, device, dtype
        self.max_loras, self.max_lora_rank = max_loras, max_lora_rank
        self.modules = model.lora_modules()
        self.context = _hooked_context(model, {own for own, _, _ in self.modules.values()})
        self.adapters: dict[int, LoRAAdapter] = {}
        self.on_device: OrderedDict[int, dict[str, LayerLoRA]] = OrderedDict()   # least recently used first

    def add(self, request: LoRARequest) -> bool:
        """Load the adapter unless its id is loaded already (then it must be the same folder); True if loaded."""
        known = self.adapters.get(request.lora_int_id)
        if known is not None:
            if os.path.realpath(known.request.lora_path) != os.path.realpath(request.lora_path):
                raise ValueError(f"LoRA adapter {request.lora_name!r}: lora_int_id {request.lora_int_id} is "
                                 f"already adapter {known.request.lora_name!r} ({known.request.lora_path}), not "
                                 f"{request.lora_path}: give each adapter its own id")
            return False
        namesake = next((a.request for a in self.adapters.values() if a.request.lora_name == request.lora_name
                         and os.path.realpath(a.request.lora_path) != os.path.realpath(request.lora_path)), None)
        if namesake is not None:      # its blocks would be served this one's prompts (they are keyed by name)
            raise ValueError(f"LoRA adapter {request.lora_name!r} is loaded already as lora_int_id "
                             f"{namesake.lora_int_id} ({namesake.lora_path}), not {request.lora_path}: prefix-cache "
                             f"blocks are keyed by an adapter's name, so give it another name, or remove that one")
        self.adapters[request.lora_int_id] = load_adapter(request, self.model, self.modules, self.max_lora_rank)
        return True

    def remove(self, lora_id: int) -> bool:
        self.on_device.pop(lora_id, None)
        return self.adapters.pop(lora_id, None) is not None

    def _device_weights(self, ids: list[int]) -> list[dict[str, LayerLoRA]]:
        """The step's adapters on the device, loading those not there and evicting the least recently
        used others to hold at most max_loras."""
        if len(ids) > self.max_loras:
            raise RuntimeError(f"a step runs {len(ids)} LoRA adapters, more than max_loras {self.max_loras}")
        for lora_id in ids:
            if lora_id in self.on_device:
                self.on_device.move_to_end(lora_id)
                continue
            while len(self.on_device) >= self.max_loras:
                self.on_device.popitem(last=False)
            self.on_device[lora_id] = self.adapters[lora_id].to(self.device, self.dtype)
        return [self.on_device[lora_id] for lora_id in ids]

    def step_loras(self, lora_ids: list[int], token_counts: list[int] | None) -> StepLoRAs | None:
        """The mapping for a batch packing sequence j's ``token_counts[j]`` tokens (None: one each), of
        adapter ``lora_ids[j]`` (0: none), in order; None when no sequence has an adapter."""
        ids = sorted(set(lora_ids) - {0})
        if not ids:
            return None
        weights = self._device_weights(ids)
        if len(ids) == 1 and 0 not in lora_ids:    # the whole batch: no gather, no scatter
            return [(None, weights[0])]
        per_token = torch.tensor(lora_ids)
        if token_counts is not None:
            per_token = torch.repeat_interleave(per_token, torch.tensor(token_counts))
        return [((per_token == lora_id).nonzero().squeeze(1).to(self.device), w) for lora_id, w in zip(ids, weights)]

    @contextmanager
    def applied(self, lora_ids: list[int], token_counts: list[int] | None) -> Iterator[None]:
        """Within it, the model's forward applies these sequences' adapters (see ``step_loras``)."""
        self.context.step = self.step_loras(lora_ids, token_counts)
        try:
            yield
        finally:
            self.context.step = None
