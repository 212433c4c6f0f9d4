"""A decode replica's admission of requests prefilled elsewhere, as vLLM v1's KV connector does it.

In vLLM's disaggregated serving (a KV connector such as NixlConnector, the proxy
sending each request to a prefill instance with max_tokens=1, then to a decode
instance with the prefill's `kv_transfer_params`), the decode scheduler meets the
request in its waiting queue and, in its waiting pass (vllm/v1/core/sched/scheduler.py):

1. asks the connector how many prompt tokens come from outside
   (`get_num_new_matched_tokens`: the prompt less its local prefix-cache hits),
   allocates blocks for the whole prompt, and parks the request as
   WAITING_FOR_REMOTE_KVS; if the blocks cannot be had, the pass stops (FCFS);
2. skips a parked request while its KV is in flight (the worker reads it from the
   prefill instance; other waiting requests are still admitted behind it), and
   puts skipped requests back at the head of the queue after the pass;
3. once the KV has arrived (`_update_waiting_for_remote_kv`) sets its computed
   tokens to the prompt less one, so the decode instance computes the last prompt
   token itself and samples the first output token: the request then runs as any
   other (budget and max_num_seqs permitting), one token after a cached context.

A parked request neither counts toward max_num_seqs nor spends token budget, but
holds its blocks. A request preempted after admission is recomputed locally, as
vLLM does (its transfer is spent). `DecodeScheduler` is the engine core's own
`ChunkedScheduler` with this pass; a local request goes through the core's own
admission code.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from engine.core.chunked_scheduler import ChunkedScheduler
from engine.core.sequence import SequenceGroup, SequenceStatus


@dataclass(slots=True)
class Remote:
    """A request prefilled in the prefill pool, on its way through the decode replica's admission."""

    handed_at: float                    # the prefill finished and the proxy sent it on
    prefill_replica: int
    decode_replica: int
    allocated_at: float | None = None   # blocks held, the transfer starts
    tokens: int = 0                     # prompt tokens transferred (the prompt less local prefix hits)
    num_bytes: float = 0.0
    seconds: float = 0.0                # the transfer's duration
    arrived_at: float | None = None     # the KV is in the decode replica's blocks
    admitted_at: float | None = None    # it runs (its first decode-side token is computed in this step)


class DecodeScheduler(ChunkedScheduler):
    """vLLM v1's scheduler of a decode instance: the waiting pass also admits remote prefills."""

    def __init__(self, adopted: ChunkedScheduler, on_loading: Callable[[SequenceGroup, Remote, float], None]):
        self.__dict__.update(adopted.__dict__)    # the config, allocator and queues make_engine built
        self.remote: dict[str, Remote] = {}       # request id -> its hand-off, until it runs
        self.on_loading = on_loading              # starts the KV transfer of a request given its blocks

    def add_remote(self, group: SequenceGroup, remote: Remote) -> None:
        self.remote[group.request_id] = remote
        self.add(group)

    def kv_arrived(self, group: SequenceGroup, now: float) -> None:
        self.remote[group.request_id].arrived_at = now

    def schedule_waiting(self, now: float, budget: int, groups: list, seqs: list, counts: list,
                         rejected: list, truncated: list) -> int:
        skipped: list[SequenceGroup] = []
        max_num_seqs = self.config.max_num_seqs
        while self.waiting and budget > 0 and len(self.running) < max_num_seqs:
            group = self.waiting[0]
            remote = self.remote.get(group.request_id)
            if remote is None:
                left = self._admit_local(now, budget, groups, seqs, counts, rejected, truncated)
                if left is None:
                    break
                budget = left
            elif remote.allocated_at is None:
                problem = self.never_fits(group)
                if problem is not None:
                    self.waiting.popleft()
                    del self.remote[group.request_id]
                    self._reject(group, problem, now, rejected)
                elif not self._park(group, remote, now):
                    break
                else:
                    skipped.append(self.waiting.popleft())
            elif remote.arrived_at is None or remote.arrived_at > now:
                skipped.append(self.waiting.popleft())
            else:
                self._run_remote(group, remote, now, groups, seqs, counts)
                budget -= 1
        self.waiting.extendleft(reversed(skipped))
        return budget

    def _admit_local(self, now, budget, groups, seqs, counts, rejected, truncated) -> int | None:
        """The core's own waiting pass over the head alone (a request recomputed after preemption): the
        budget left, or None when it stays waiting (the pass stops there, as vLLM's does)."""
        rest = self.waiting
        self.waiting = type(rest)()             # the head alone, in a queue of the same kind (FCFS or priority)
        self.waiting.append(rest[0])
        try:
            left = super().schedule_waiting(now, budget, groups, seqs, counts, rejected, truncated)
            handled = not self.waiting
        finally:
            self.waiting = rest
        if not handled:
            return None
        rest.popleft()
        return left

    def _park(self, group: SequenceGroup, remote: Remote, now: float) -> bool:
        """Blocks for the whole prompt (local prefix hits shared), the transfer started; False when the
        blocks cannot be had."""
        seq = group.seqs[0]
        hit = self.allocator.cached_prefix(seq)
        if self.allocator.blocks_to_admit(hit, seq.num_tokens) > self.allocator.num_free_blocks():
            return False
        self.allocator.admit(seq, hit, seq.num_tokens)
        cached = len(hit) * self.allocator.block_size
        self.count_lookup(group, seq.num_tokens, cached)
        remote.allocated_at = now
        remote.tokens = seq.num_tokens - cached
        self.on_loading(group, remote, now)
        return True

    def _run_remote(self, group: SequenceGroup, remote: Remote, now: float, groups, seqs, counts) -> None:
        """The KV is here: the last prompt token is computed in this step (vLLM recomputes it to
        sample the first token), then the request decodes."""
        seq = group.seqs[0]
        self.waiting.popleft()
        del self.remote[group.request_id]
        seq.num_computed_tokens = seq.num_tokens - 1
        self._cache(seq, seq.num_tokens - 1)
        seq.status = SequenceStatus.RUNNING
        group.times.first_scheduled = now
        remote.admitted_at = now
        self.running.append(group)
        groups.append(group)
        seqs.append(seq)
        counts.append(1)
