"""What a cost model is asked: the shape of one engine step, and the interface that prices it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # the cost package prices shapes; it needs the engine only for this type
    from engine.core.scheduler import SchedulerOutput


@dataclass(slots=True, unsafe_hash=True)
class StepShape:
    """Everything about one scheduler step that its duration depends on (counts, not ids).

    A value (hashed by its fields: the capacity probes dedupe shapes), read-only by convention
    rather than frozen: a frozen dataclass sets each field through object.__setattr__, which
    makes it about four times as dear to build (2.4 us against 0.55 us here), and the simulator
    builds one for nearly every step it prices."""

    prefill_seqs: int = 0          # sequences that compute more than one new token this step (prompts, recomputes)
    prefill_tokens: int = 0        # new tokens computed for those sequences (sum)
    prefill_attn_pairs: int = 0    # (query, key) pairs attended in prefill: sum of new*cached + new*(new+1)/2
    decode_seqs: int = 0           # sequences decoding: one new token each after a cached context (plus their drafts)
    decode_context: int = 0        # keys read by decode attention: sum of their context lengths (incl. the new tokens)
    swap_blocks: int = 0           # KV blocks moved between GPU and CPU this step (in + out)
    copy_blocks: int = 0           # copy-on-write block copies this step
    # The decode contexts one by one, as a histogram over power-of-two buckets:
    # flat triples (bucket, sequences, sum of their contexts), buckets ascending,
    # bucket k holding contexts in (2**(k-1), 2**k] (see context_histogram).
    # Empty: the producer did not say, and a model that needs it assumes every
    # sequence is at the mean context. Models linear in context use the sum.
    decode_histogram: tuple[int, ...] = ()
    # Speculative decoding: a decode sequence verifying d drafts computes d + 1 tokens, its last one and
    # each draft, as one query of d + 1 rows over its context (vLLM's attention reads the sequence's keys
    # once: decode_context counts them once, at the last row's context). draft_tokens sums the d's;
    # draft_keys the keys the draft rows would read run as decode rows of their own (each at its
    # position: d * cached + d (d + 1) / 2 for a sequence with `cached` tokens before the step), which
    # is how this project's engine runs them (engine/llm_engine.py, _execute_speculative).
    draft_tokens: int = 0
    draft_keys: int = 0
    lora_adapters: int = 0         # LoRA adapters the step's requests run (planner/cost/lora.py prices them)
    lora_loads: int = 0            # of those, the ones loaded into a GPU slot for this step
    offload_blocks: int = 0        # KV blocks loaded from and stored to the CPU tier (--kv-offloading-size)
    # Tokens already cached that prefill sequences continue from (the sum of their cached contexts: a
    # prefix-cache hit, an earlier chunk). Their keys are read back from the paged cache, which a fresh
    # prompt's are not: the engine gathers them per layer (engine/attention.py), vLLM's kernels read them
    # block by block. Last, so positional construction elsewhere keeps its meaning.
    prefill_context: int = 0

    @property
    def total_tokens(self) -> int:
        """Tokens that go through the model: every prefill token, one per decode sequence, and the drafts."""
        return self.prefill_tokens + self.decode_seqs + self.draft_tokens

    @property
    def batch_size(self) -> int:
        """Sequences in the step (a sequence verifying drafts counts once)."""
        return self.prefill_seqs + self.decode_seqs

    @property
    def logit_rows(self) -> int:
        """Rows the LM head and the sampler see: one per sequence, and one per draft it verifies."""
        return self.prefill_seqs + self.decode_seqs + self.draft_tokens

    @property
    def is_empty(self) -> bool:
        """Nothing computed and nothing moved: such a step costs nothing."""
        return self.total_tokens == 0 and self.swap_blocks == 0 and self.copy_blocks == 0 and self.offload_blocks == 0


def prefill_attn_pairs(new_tokens: int, cached_tokens: int = 0) -> int:
    """(query, key) pairs for one sequence computing `new_tokens` after `cached_tokens` (causal mask)."""
    return new_tokens * cached_tokens + new_tokens * (new_tokens + 1) // 2


def context_bucket(context: int) -> int:
    """The histogram bucket of a decode context: k such that 2**(k-1) < context <= 2**k.

    Powers of two because they are the context grid of the measured
    generation-attention tables, which a model can then price exactly per
    bucket from its count and sum (time is linear in context between grid points).
    """
    return (context - 1).bit_length()


def context_histogram(contexts) -> tuple[int, ...]:
    """StepShape.decode_histogram of these decode contexts."""
    bins: dict[int, list[int]] = {}
    for c in contexts:
        k = (c - 1).bit_length()                   # context_bucket, inlined: hot path
        entry = bins.get(k)
        if entry is None:
            bins[k] = [1, c]
        else:
            entry[0] += 1
            entry[1] += c
    flat: list[int] = []
    for k in sorted(bins):
        flat += (k, *bins[k])
    return tuple(flat)


def step_shape(out: "SchedulerOutput", histogram: bool = True) -> StepShape:
    """The shape of a scheduled step. Call it before ``scheduler.update``, which marks
    the step's tokens computed and so erases what this reads. ``histogram=False``
    leaves decode_histogram empty, for a cost model that does not read it.

    Steps are classified as a whole, the way the engine runs them: every sequence
    of a prefill step goes through the prompt path (even one left with a single
    uncomputed token by a prefix-cache hit), every sequence of a decode step
    computes one token against its whole context.
    """
    swap = len(out.blocks_to_swap_in) + len(out.blocks_to_swap_out)
    copies = len(out.blocks_to_copy)
    if out.num_scheduled_tokens is not None:
        shape = mixed_step_shape(out.seqs, out.num_scheduled_tokens, swap, copies, histogram)
        if out.lora_adapters:
            shape.lora_adapters, shape.lora_loads = out.lora_adapters, out.lora_loads
        if out.kv_loads or out.kv_stores:
            shape.offload_blocks = len(out.kv_loads) + len(out.kv_stores)
        return shape
    if out.is_prefill:
        tokens = pairs = context = 0
        for seq in out.seqs:
            cached = seq.num_computed_tokens            # prefix-cache hit, or 0
            new = len(seq.token_ids) - cached
            tokens += new
            context += cached
            pairs += new * cached + new * (new + 1) // 2   # prefill_attn_pairs, inlined: hot path
        return StepShape(prefill_seqs=len(out.seqs), prefill_tokens=tokens, prefill_attn_pairs=pairs,
                         swap_blocks=swap, copy_blocks=copies, prefill_context=context)
    contexts = [len(seq.token_ids) for seq in out.seqs]
    return StepShape(decode_seqs=len(contexts), decode_context=sum(contexts),
                     decode_histogram=context_histogram(contexts) if histogram else (),
                     swap_blocks=swap, copy_blocks=copies)


def mixed_step_shape(seqs, scheduled, swap: int, copies: int, histogram: bool,
                     drafts: dict[int, list[int]] | None = None) -> StepShape:
    """A chunked-prefill step, per sequence as the runner packs it: one new token
    after a cached context is a decode; anything else (a prompt chunk, with the
    tokens already cached as its context) goes through prefill attention. A decode
    verifying d drafts (`drafts` by sequence id) is a decode sequence at the context
    of its last row, with d draft tokens (StepShape.draft_tokens, draft_keys)."""
    prefill_seqs = tokens = pairs = draft_tokens = draft_keys = prefill_context = 0
    contexts = []
    for seq, new in zip(seqs, scheduled):
        d = len(drafts.get(seq.seq_id, ())) if drafts else 0
        cached = seq.num_computed_tokens
        if new - d == 1 and cached > 0:
            contexts.append(cached + d + 1)
            if d:
                draft_tokens += d
                draft_keys += d * cached + d * (d + 1) // 2
        else:
            prefill_seqs += 1
            tokens += new
            prefill_context += cached
            pairs += new * cached + new * (new + 1) // 2
    return StepShape(prefill_seqs=prefill_seqs, prefill_tokens=tokens, prefill_attn_pairs=pairs,
                     decode_seqs=len(contexts), decode_context=sum(contexts),
                     decode_histogram=context_histogram(contexts) if histogram else (),
                     swap_blocks=swap, copy_blocks=copies, draft_tokens=draft_tokens, draft_keys=draft_keys,
                     prefill_context=prefill_context)


def reads_context_histogram(cost_model) -> bool:
    """Does `cost_model` price decode attention per context (read StepShape.decode_histogram)?
    A model says so with `prices_each_context`; one that does not say is assumed to."""
    return getattr(cost_model, "prices_each_context", True)


@runtime_checkable
class CostModel(Protocol):
    """Predicts how long a step takes. The simulator calls step_time for every step, so keep it cheap."""

    name: str                      # e.g. "roofline(a100-40g)" or "calibrated(profiles/cpu/opt-125m.json)"

    def step_time(self, shape: StepShape) -> float:
        """Seconds for the step; 0.0 for an empty shape."""
        ...
