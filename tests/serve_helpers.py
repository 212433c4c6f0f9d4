"""A tiny model folder with the catalog's byte-level tokenizer, and helpers for tests of a running server."""
from __future__ import annotations

import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from planner.profile.byte_tokenizer import build_byte_tokenizer


def save_byte_model(folder, max_position_embeddings: int = 128) -> str:
    """A random 2-layer Llama whose vocabulary (320) holds the 256 byte tokens, plus that tokenizer."""
    torch.manual_seed(4321)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=320, max_position_embeddings=max_position_embeddings,
                         eos_token_id=2, bos_token_id=1, pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.15)
    model.save_pretrained(folder, safe_serialization=True)
    build_byte_tokenizer(folder)
    return str(folder)


def wait_until(condition, timeout: float = 20.0) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def metric(text: str, name: str, **labels) -> float:
    """The sum of a Prometheus sample's values over the lines whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head = line.rsplit(" ", 1)[0]
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def sse_events(response) -> list[str]:
    """The data of every server-sent event of a streamed httpx response."""
    return [line[6:] for line in response.iter_lines() if line.startswith("data: ")]


def engine_idle(engine) -> bool:
    """No request left and every KV block free (the vllm-v1 policy's null block aside)."""
    alloc = engine.allocator
    usable = alloc.num_gpu_blocks - (1 if engine.deployment.enable_chunked_prefill else 0)
    return not engine.has_unfinished_requests() and alloc.num_free_blocks() == usable
