"""Draft-model speculation (vLLM's method "draft_model"): a smaller model of the same vocabulary
proposes the k tokens the target verifies.

The proposer drafts greedily (the draft model's most likely token at each position). The target's
sampler verifies any proposal the same way (engine/sampler.py `verify`): it draws the token it
would have drawn without speculation and accepts a draft that equals it, which for a deterministic
proposal is speculative sampling's own rule (a draft d is accepted with probability p(d)). Greedy and
seeded requests therefore keep exactly their outputs. vLLM's draft-model proposer may instead sample
the draft and accept by p/q, which accepts more often at high temperatures; the outputs' distribution
is the same either way.

The draft model runs through transformers with a cache per sequence (``DynamicCache``), not in the
paged KV cache: its memory is outside the block manager (vLLM keeps the draft's KV in the same block
tables). After each verification the cache is cut back to the longest prefix the sequence still
shares with what the draft saw, so rejected drafts cost nothing more; the tokens after it are fed in
one pass, then one pass per further draft.
"""
from __future__ import annotations

import inspect
from pathlib import Path

import torch

from engine.core.speculative import SpecDecodingStats, draft_limit
from engine.models.loader import read_config


class DraftModelProposer:
    """Greedy drafts from the model in `folder` for the scheduler's speculating sequences."""

    def __init__(self, folder: str, k: int, max_model_len: int, stats: SpecDecodingStats | None,
                 *, vocab_size: int, device: torch.device, dtype: torch.dtype) -> None:
        from transformers import AutoModelForCausalLM      # the draft model's runtime
        if not (Path(folder) / "config.json").is_file():
            raise ValueError(f"draft model {folder}: not a model folder (no config.json)")
        config = read_config(folder)
        draft_vocab = getattr(config, "vocab_size", None)
        if draft_vocab != vocab_size:
            raise ValueError(f"draft model {folder}: vocabulary of {draft_vocab} tokens, the target's has "
                             f"{vocab_size}; a draft model must share the target's tokenizer")
        self.model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=dtype)
        self.model.to(device).eval()
        # transformers 5 renames forward's past_key_values to cache (the old name warns, then goes).
        self._cache_arg = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        self.device = device
        self.k = k
        self.max_model_len = max_model_len
        # The positions the draft model has (GPT-2's and OPT's are learned: none past them). A sequence that
        # has reached them gets no more drafts; the target decodes it alone (as vLLM caps a draft model's
        # max_model_len at its own).
        self.draft_positions = getattr(config, "max_position_embeddings", None) or max_model_len
        self.stats = stats
        self._seen: dict[int, tuple[object, list[int]]] = {}   # seq id -> (its cache, the tokens it holds)

    def propose(self, group, seq) -> list[int]:
        # (the draft model sees the sequence and all but its last draft: positions up to num_tokens + limit - 2)
        limit = min(draft_limit(group, seq, self.k, self.max_model_len), self.draft_positions + 1 - seq.num_tokens)
        if limit <= 0:
            return []
        drafts = self._draft(seq.seq_id, seq.token_ids, limit)
        if self.stats is not None:
            # A draft model always proposes k tokens (before the caps): its drafting curve is 1.
            self.stats.observe_lookup(self.k, seq.last_lookup_drafted)
        seq.last_lookup_drafted = True
        return drafts

    def forget(self, seq_id: int) -> None:
        """Drop a finished or aborted sequence's cache."""
        self._seen.pop(seq_id, None)

    @torch.inference_mode()
    def _draft(self, seq_id: int, tokens: list[int], n: int) -> list[int]:
        from transformers import DynamicCache
        cache, held = self._seen.get(seq_id) or (DynamicCache(), [])
        keep = _common_prefix(held, tokens, len(tokens) - 1)    # at least one token to feed
        if len(held) > keep:
            cache.crop(keep - len(held))                         # transformers 5: a negative count removes
        logits = self._forward(tokens[keep:], cache)
        drafts = []
        for i in range(n):
            drafts.append(int(logits.argmax()))
            if i + 1 < n:
                logits = self._forward(drafts[-1:], cache)
        self._seen[seq_id] = (cache, tokens + drafts[:-1])
        return drafts

    def _forward(self, ids: list[int], cache) -> torch.Tensor:
        out = self.model(input_ids=torch.tensor([ids], device=self.device), **{self._cache_arg: cache},
                         use_cache=True)
        return out.logits[0, -1]


def _common_prefix(a: list[int], b: list[int], most: int) -> int:
    n = min(len(a), len(b), most)
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
