"""PEFT LoRA adapter folders with random weights, for tests of the engine's and the server's adapters."""
from __future__ import annotations

import json

import torch
from safetensors.torch import save_file
from torch import nn


def save_adapter(folder, base, targets, *, r=8, alpha=16, seed=0, **config):
    """A PEFT LoRA folder for the HF model ``base`` on the linear modules named ``targets``, with random
    nonzero A [r, in] and B [out, r] (PEFT starts B at zero: a trained adapter's is not). ``config``
    adds to or overrides adapter_config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, module in base.named_modules():
        if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in targets:
            key = f"base_model.model.{name}"
            weights[f"{key}.lora_A.weight"] = torch.randn(r, module.in_features, generator=gen) * 0.1
            weights[f"{key}.lora_B.weight"] = torch.randn(module.out_features, r, generator=gen) * 0.1
    save_file(weights, str(folder / "adapter_model.safetensors"))
    settings = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": alpha,
                "target_modules": list(targets), "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
                "use_rslora": False, "use_dora": False, "modules_to_save": None, "rank_pattern": {},
                "alpha_pattern": {}}
    settings.update(config)
    (folder / "adapter_config.json").write_text(json.dumps(settings))
    return str(folder)
