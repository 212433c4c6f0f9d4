"""What a cost model is asked: the shape of one engine step, and the interface that prices it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class StepShape:
    """Everything about one scheduler step that its duration depends on (counts, not ids)."""

    prefill_seqs: int = 0          # sequences that compute more than one new token this step (prompts, recomputes)
    prefill_tokens: int = 0        # new tokens computed for those sequences (sum)
    prefill_attn_pairs: int = 0    # (query, key) pairs attended in prefill: sum of new*cached + new*(new+1)/2
    decode_seqs: int = 0           # sequences computing exactly one new token
    decode_context: int = 0        # keys read by decode attention: sum of their context lengths (incl. the new token)
    swap_blocks: int = 0           # KV blocks moved between GPU and CPU this step (in + out)
    copy_blocks: int = 0           # copy-on-write block copies this step

    @property
    def total_tokens(self) -> int:
        """Tokens that go through the model: every prefill token plus one per decode sequence."""
        return self.prefill_tokens + self.decode_seqs

    @property
    def batch_size(self) -> int:
        return self.prefill_seqs + self.decode_seqs

    @property
    def is_empty(self) -> bool:
        """Nothing computed and nothing moved: such a step costs nothing."""
        return self.total_tokens == 0 and self.swap_blocks == 0 and self.copy_blocks == 0


def prefill_attn_pairs(new_tokens: int, cached_tokens: int = 0) -> int:
    """(query, key) pairs for one sequence computing `new_tokens` after `cached_tokens` (causal mask)."""
    return new_tokens * cached_tokens + new_tokens * (new_tokens + 1) // 2


@runtime_checkable
class CostModel(Protocol):
    """Predicts how long a step takes. The simulator calls step_time for every step, so keep it cheap."""

    name: str                      # e.g. "roofline(a100-40g)" or "calibrated(profiles/cpu/opt-125m.json)"

    def step_time(self, shape: StepShape) -> float:
        """Seconds for the step; 0.0 for an empty shape."""
        ...
