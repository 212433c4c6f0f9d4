"""Prefix caching in the simulator for blocks no other request can hit: no work until their owner comes back.

With prefix caching vLLM v1 registers every full block of a request under a key hashed from its
tokens, the blocks of its sampled tokens included. In a simulation a request's sampled tokens are
its own random draws (a conversation's next turn holds the answer the trace gives, which stays an
ordinary block), so no other request can hold tokens equal to them: a block past the prompt's full
blocks (the block the prompt ends in holds sampled tokens too) is private. The only lookup that can
find one is its owner's own, when vLLM preempts it by recompute and it comes back through the
waiting queue with its prompt and its tokens so far.

`PrivateBlockManager` gives that behaviour without drawing, writing or hashing a token of them:
the simulated executor samples a constant for private tokens, and their blocks are not registered
while the request runs. When the request is preempted they are registered, before they are
released, under keys made of its sequence id and the block's index, which its lookup on coming
back uses too. Nothing else can tell this from vLLM's registering them as they fill:
- only the owner ever looks a private key up, and it does so only after a preemption, which
  registered every private block vLLM had registered by then (a preempted request has computed
  all it was scheduled: its computed tokens are what vLLM had cached);
- vLLM v1's pool frees a block to the back of one queue whether it has a key or not
  (`VllmBlockPool`), so blocks are reused in the same order and every other request's hits are
  the same;
- a finished request never comes back: its private blocks are never registered.
A prompt no other request shares (a plain request's own random ids, one sample) is private the same
way, from its first block: the simulated executor gives it one constant id of its own instead of
drawing ids, and neither its blocks nor its keys are made until it is preempted. (A request fanned
out into n samples is not: its children share its prompt's blocks.)
With a CPU KV tier (`--kv-offloading-size`, engine/core/kv_offload.py) a private block is keyed as it
fills, under its private key, and registered at once: the tier stores every full block, sampled ones
too, and an owner preempted by recompute may load its own back, asking for the same keys (`tier_keys`).
Registering early changes nothing the argument above rests on: the pool's order is the same, and only
the owner ever asks for the key. Prefix-cache statistics come from the same lookups. The paper's block
pool is left as it is: there a freed block with a key waits behind those without one, so registering
changes the order.
"""
from __future__ import annotations

from engine.core.block_keys import chained_hashes
from engine.core.chunked_scheduler import VllmBlockManager
from engine.core.sequence import Sequence

# The first element of a private key's tuple: a content key hashes (parent key, token ids), a
# private one (tag, sequence id, block index), so the two never meet (an int tag, not a string,
# keeps keys the same from one process to the next).
_PRIVATE = -1


class PrivateBlockManager(VllmBlockManager):
    """vLLM v1's block manager whose sequences' blocks past their prompt's full blocks are private,
    unless `public` lists the sequence (a conversation turn whose answer the trace gives)."""

    def __init__(self, block_size: int, num_gpu_blocks: int, state_blocks: int = 0, offload_blocks: int = 0) -> None:
        super().__init__(block_size, num_gpu_blocks, enable_prefix_caching=True, state_blocks=state_blocks,
                         offload_blocks=offload_blocks)
        self.public: set[int] = set()          # sequence ids whose every block is keyed by its tokens
        self.own_prompts: set[int] = set()     # sequence ids whose prompt no other request holds

    def _private_from(self, seq: Sequence) -> int | None:
        """The index of the sequence's first private block (None: none is)."""
        seq_id = seq.seq_id
        if seq_id in self.public:
            return None
        return 0 if seq_id in self.own_prompts else seq.prompt_len // self.block_size

    def cached_prefix(self, seq: Sequence) -> list[tuple[int, int]]:
        first = self._private_from(seq)
        if first is None:
            return super().cached_prefix(seq)
        cached, count = self.gpu.cached, (seq.num_tokens - 1) // self.block_size
        hit: list[tuple[int, int]] = []
        for h in chained_hashes(seq.token_ids, self.block_size, min(first, count), seq.cache_root):
            block = cached.get(h)
            if block is None:
                return hit
            hit.append((block, h))
        for i in range(first, count):     # its own blocks, registered when it was preempted (or as they filled)
            h = private_key(seq.seq_id, i)
            block = cached.get(h)
            if block is None:
                break
            hit.append((block, h))
        return hit

    def mark_computed(self, seq: Sequence, num_tokens: int | None = None) -> None:
        first = self._private_from(seq)
        if first is None:
            return super().mark_computed(seq, num_tokens)
        upto = seq.num_computed_tokens if num_tokens is None else num_tokens
        if first:
            super().mark_computed(seq, min(upto, first * self.block_size))
        if self.offload is not None:     # the tier stores every full block: its private ones keyed as they fill
            hashes = self.seq_hashes.setdefault(seq.seq_id, [])
            if len(hashes) >= first:
                table, register = self.tables[seq.seq_id], self.gpu.register
                for i in range(len(hashes), upto // self.block_size):
                    hashes.append(private_key(seq.seq_id, i))
                    register(table[i], hashes[-1])

    def tier_keys(self, seq: Sequence, hit: list[tuple[int, int]]) -> list[int]:
        first = self._private_from(seq)
        if first is None:
            return super().tier_keys(seq, hit)
        bs, local, full = self.block_size, len(hit), seq.num_tokens // self.block_size
        keys = [h for _, h in hit]
        if local < min(first, full):
            keys += chained_hashes(seq.token_ids[local * bs:], bs, min(first, full) - local,
                                   keys[-1] if keys else seq.cache_root)
        keys += [private_key(seq.seq_id, i) for i in range(max(local, first), full)]
        return keys

    def free(self, seq: Sequence) -> None:
        if seq.is_finished:
            self.public.discard(seq.seq_id)
            self.own_prompts.discard(seq.seq_id)
        elif seq.seq_id in self.tables and seq.seq_id not in self.public and self.offload is None:
            self._register_private(seq)
        super().free(seq)

    def _register_private(self, seq: Sequence) -> None:
        """A preempted sequence's private blocks enter the prefix cache: those of its computed tokens,
        which is what vLLM had registered by the step it was last scheduled in."""
        table, register = self.tables[seq.seq_id], self.gpu.register
        for i in range(self._private_from(seq), seq.num_computed_tokens // self.block_size):
            register(table[i], private_key(seq.seq_id, i))


def private_key(seq_id: int, index: int) -> int:
    """The key of a sequence's private block `index`."""
    return hash((_PRIVATE, seq_id, index))
