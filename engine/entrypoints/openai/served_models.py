"""The models a server answers to: the base model under its served name, and the LoRA adapters of --lora-modules.

As vLLM's ``OpenAIServingModels`` (vllm/entrypoints/openai/models/serving.py): each ``--lora-modules``
entry is ``NAME=PATH`` or a JSON object ``{"name", "path", "base_model_name"}`` (vLLM's
``LoRAModulePath``), its ``lora_int_id`` the next of 1, 2, ... in the order given, and every adapter is
loaded when the server starts (one that the engine cannot serve stops the start, in the engine's words).
A request's ``model`` picks what it runs with: the served name (or none) the base model, an adapter's
name that adapter; any other name is vLLM's 404. ``/v1/models`` lists the base model, then each adapter
with ``root`` its folder and ``parent`` the base model, as vLLM lists them.

With ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` set (vLLM's switch, for development), ``/v1/load_lora_adapter``
and ``/v1/unload_lora_adapter`` add and drop adapters while the server runs (``add``, ``remove``), with
vLLM's checks and words (vllm/entrypoints/openai/models/serving.py): a new name takes the next id, one
already served is refused unless ``load_inplace`` (then it keeps its id and its weights are read again).
"""
from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass

from engine.entrypoints.openai.errors import RequestError, said
from engine.lora import LoRARequest

MODULE_FIELDS = ("name", "path", "base_model_name")
INVALID = "InvalidUserInput"      # vLLM's error type for a load or unload request it refuses
SYNTAX = 'NAME=PATH or a JSON object {"name": ..., "path": ...}'


@dataclass(frozen=True)
class LoRAModulePath:
    """One adapter of --lora-modules (vLLM's fields). ``base_model_name``: the model it adapts; this server
    serves one, which is every adapter's parent whatever is given (vLLM falls back to its first one too)."""

    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(item: str) -> LoRAModulePath:
    """One --lora-modules value, or a ValueError in one line."""
    text = item.strip()
    if text.startswith("{"):
        return _from_json(text)
    name, sep, path = text.partition("=")
    if not (sep and name.strip() and path.strip()):
        raise ValueError(f"--lora-modules {item!r}: give {SYNTAX}")
    return LoRAModulePath(name.strip(), path.strip())


def _from_json(text: str) -> LoRAModulePath:
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"--lora-modules {text!r} is not valid JSON ({exc}): give {SYNTAX}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"--lora-modules {text!r}: give {SYNTAX}")
    unknown = sorted(set(doc) - set(MODULE_FIELDS))
    if unknown:
        raise ValueError(f"--lora-modules {text!r}: unknown field(s) {', '.join(unknown)} (it takes "
                         f"{', '.join(MODULE_FIELDS)})")
    for key in ("name", "path"):
        if not (isinstance(doc.get(key), str) and doc[key].strip()):
            raise ValueError(f"--lora-modules {text!r}: {key!r} must be a non-empty string")
    base = doc.get("base_model_name")
    if base is not None and not isinstance(base, str):
        raise ValueError(f"--lora-modules {text!r}: 'base_model_name' must be a string")
    return LoRAModulePath(doc["name"].strip(), doc["path"].strip(), base)


def parse_lora_modules(items: list[str] | None) -> list[LoRAModulePath]:
    """Every --lora-modules value, empty ones skipped as vLLM does (ServedModels refuses a name given twice)."""
    return [parse_lora_module(item) for item in items or [] if item.strip()]


class ServedModels:
    """The served base model and the adapters by name (their LoRARequests, ids 1, 2, ... in order)."""

    def __init__(self, base_name: str, modules: list[LoRAModulePath] | None = None) -> None:
        self.base_name = base_name
        self.adapters: dict[str, LoRARequest] = {}
        for lora_int_id, module in enumerate(modules or [], start=1):
            if module.name == base_name:
                raise ValueError(f"--lora-modules: the adapter {module.name!r} has the served model's name; "
                                 f"give it another (a request's `model` says which one it runs)")
            if module.name in self.adapters:
                raise ValueError(f"--lora-modules names the adapter {module.name!r} twice: give each its own name")
            self.adapters[module.name] = LoRARequest(module.name, lora_int_id, module.path)
        self.last_id = len(self.adapters)      # ids are never given twice (vLLM's counter), a failed load's included
        self.changing: dict[str, asyncio.Event] = {}    # names being loaded or unloaded now: set when done

    async def hold(self, name: str) -> None:
        """Wait until no other request loads or unloads `name`, then hold it until `done` (vLLM's lock per
        adapter name: a second load of one name waits for the first, then finds it loaded)."""
        while name in self.changing:
            await self.changing[name].wait()
        self.changing[name] = asyncio.Event()

    def done(self, name: str) -> None:
        self.changing.pop(name).set()

    def to_load(self, name: str, path: str, inplace: bool = False) -> LoRARequest:
        """The adapter /v1/load_lora_adapter asks for (`add` it once the engine has it), or vLLM's 400 for a
        request it refuses."""
        if not name or not path:
            raise RequestError("Both 'lora_name' and 'lora_path' must be provided.", kind=INVALID)
        if name == self.base_name:
            raise RequestError(f"The lora adapter '{name}' has the served model's name: give it another.",
                               param="lora_name", kind=INVALID)
        loaded = self.adapters.get(name)
        if loaded is not None and not inplace:
            raise RequestError(f"The lora adapter '{name}' has already been loaded. If you want to load the "
                               f"adapter in place, set 'load_inplace' to True.", param="lora_name", kind=INVALID)
        if loaded is None:
            self.last_id += 1
        return LoRARequest(name, loaded.lora_int_id if loaded else self.last_id, path)

    def add(self, lora: LoRARequest) -> None:
        self.adapters[lora.lora_name] = lora

    def to_unload(self, name: str) -> LoRARequest:
        """The served adapter /v1/unload_lora_adapter names, or vLLM's 400 or 404."""
        if not name:
            raise RequestError("'lora_name' needs to be provided to unload a LoRA adapter.", kind=INVALID)
        lora = self.adapters.get(name)
        if lora is None:
            raise RequestError(f"The lora adapter '{name}' cannot be found.", param="lora_name", status=404)
        return lora

    def remove(self, lora: LoRARequest) -> None:
        del self.adapters[lora.lora_name]

    def load(self, engine) -> None:
        """Load every adapter into the engine now, so a bad folder stops the start (the engine's ValueError,
        one line) rather than failing the first request that names it."""
        for lora in self.adapters.values():
            engine.add_lora(lora)

    def lora_for(self, model: str | None) -> LoRARequest | None:
        """The adapter a request's `model` names, None for the base model; vLLM's 404 for any other name."""
        if model is None or model == self.base_name:
            return None
        lora = self.adapters.get(model)
        if lora is None:
            raise RequestError(f"The model `{said(model)}` does not exist.", param="model", status=404)
        return lora

    def name_of(self, lora: LoRARequest | None) -> str:
        """The `model` a response names: the adapter's, else the served model's (vLLM's model_name())."""
        return self.base_name if lora is None else lora.lora_name

    def cards(self, created: int, max_model_len: int) -> list[dict]:
        """/v1/models' entries. The base model's root is its served name (no folder of this machine); an
        adapter's is the folder it was given as, as vLLM lists it, with no max_model_len of its own."""
        base = {"id": self.base_name, "object": "model", "created": created, "owned_by": "paged-planner",
                "root": self.base_name, "parent": None, "max_model_len": max_model_len}
        return [base] + [{"id": name, "object": "model", "created": created, "owned_by": "paged-planner",
                          "root": lora.lora_path, "parent": self.base_name, "max_model_len": None}
                         for name, lora in self.adapters.items()]


def resolve_adapter(folder: str, name: str, base_model: str) -> str | None:
    """vLLM's filesystem LoRA resolver (vllm/plugins/lora_resolvers/filesystem_resolver.py, its folder
    $VLLM_LORA_RESOLVER_CACHE_DIR): the adapter folder `folder`/`name` when it is inside `folder` and its
    adapter_config.json says a LoRA of `base_model` (the model the server was started with), else None."""
    try:
        root = os.path.realpath(folder)
        path = os.path.realpath(os.path.join(root, name))
        if os.path.isabs(name) or os.path.commonpath([root, path]) != root:
            return None
        with open(os.path.join(path, "adapter_config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):        # no such adapter, an unreadable or broken config, a NUL in the name
        return None
    if isinstance(config, dict) and config.get("peft_type") == "LORA" and \
            config.get("base_model_name_or_path") == base_model:
        return path
    return None
