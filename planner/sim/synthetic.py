"""The simulated executor: it turns trace requests into engine requests and "samples" their tokens.

No model runs, so the tokens are synthetic. What matters is that each request
produces exactly its trace output length (max_tokens = output_len, EOS
ignored), and that token ids are real enough for the block manager: prompts
that share a prefix share its ids (so prefix-cache hits are real), and a
chatbot turn's answer is the one the trace says, so the next turn's prompt,
which contains it, hits the cache too. Nothing reads the sampled ids or
log-probabilities of a plain request (one sequence, no beams) without prefix
caching, nor with vLLM v1's, whose blocks of them no other request can hit
(planner/sim/private_blocks.py), so those get a constant token and draw
nothing: decode fast-forward then needs no per-token work for them. They are
drawn where the block manager keys their blocks by their ids: the paper's
block pool with prefix caching (whether a freed block has a key decides when
it is reused) and runs with speculation. Under vLLM v1's the prompt of a
plain request is private too, and is one id of its own rather than drawn ids.
"""
from __future__ import annotations

import random

from engine.core.scheduler import Samples, SchedulerOutput
from engine.core.sequence import SequenceGroup, SequenceStatus
from planner.sim.memory_guard import CHECK_EVERY, GUARD
from planner.sim.private_blocks import PrivateBlockManager
from workloads import Trace, TraceRequest

_RUNNING = SequenceStatus.RUNNING
_CONSTANT = [(0, 0.0)]   # what a plain request samples when nobody reads its tokens


class SyntheticExecutor:
    def __init__(self, trace: Trace, *, vocab_size: int, seed: int, real_token_ids: bool,
                 private_blocks: PrivateBlockManager | None = None) -> None:
        self.trace = trace
        self.vocab_size = vocab_size
        self.seed = seed
        # Real ids cost a numpy draw per request; without prefix caching nothing
        # looks at them, so plain requests then get a constant prompt.
        self.real_token_ids = real_token_ids
        # The block manager that keeps plain requests' sampled blocks private (told which requests
        # sample the trace's answers instead); their samples are then constant.
        self.private_blocks = private_blocks
        self.draws_samples = real_token_ids and private_blocks is None   # a plain request's samples are drawn
        self.rng = random.Random(seed)
        self.answers: dict[str, list[int]] = {}   # request id -> the trace's answer ids
        self.own_ids: dict[str, int] | None = None   # request id -> its own prompt id (`_own_id`)
        self.made = 0          # requests made, for the memory guard's cadence

    def share_answers(self, maker: SyntheticExecutor) -> None:
        """Sample the trace's answers for the requests `maker` makes: a pool's requests are all made by
        its first replica's executor, whichever replica runs them."""
        self.answers = maker.answers
        if self.private_blocks is not None:
            self.private_blocks.public = maker.private_blocks.public
            self.private_blocks.own_prompts = maker.private_blocks.own_prompts

    def make_group(self, req: TraceRequest, arrival: float | None = None) -> SequenceGroup:
        """The engine request for trace request `req`, arriving at its trace time (or at `arrival`)."""
        params = req.sampling_params()
        shared = (req.prompt_token_ids is not None or req.prefix_id is not None or req.conversation_id is not None
                  or req.hash_ids is not None)
        own = None if shared or self.private_blocks is None else self._own_id(req)
        if own is not None:
            prompt = [own] * req.prompt_len
        elif self.real_token_ids or shared:
            prompt = self.trace.prompt_token_ids(req, self.vocab_size, self.seed)
        else:
            prompt = [0] * req.prompt_len
        answered = self.real_token_ids and req.conversation_id is not None and params.best_of == 1
        if answered:
            self.answers[req.request_id] = self.trace.output_token_ids(req, self.vocab_size, self.seed)
        group = SequenceGroup(req.request_id, prompt, params, req.arrival_time if arrival is None else arrival,
                              output_len_hint=req.output_len, priority=req.priority, lora_id=req.lora,
                              cache_salt=req.cache_salt)
        if answered and self.private_blocks is not None:   # the next turn's prompt holds its answer
            self.private_blocks.public.add(group.seqs[0].seq_id)
        if own is not None and params.n == 1:                # (n children would share its blocks)
            self.private_blocks.own_prompts.add(group.seqs[0].seq_id)
        self.made += 1
        if not self.made % CHECK_EVERY:
            GUARD.check(lambda: f"at request {req.request_id}, {group.arrival_time:,.0f} s into the run")
        return group

    def _own_id(self, req: TraceRequest) -> int | None:
        """The one id a plain prompt is made of where its blocks are private (private_blocks.py): an id
        no token is (a negative one) and no other request of the trace has, so its blocks' keys, and the
        prefix-aware router's hashes of it, are its own, as its random ids would be. None for a request
        not in the trace."""
        if self.own_ids is None:
            self.own_ids = {r.request_id: -1 - i for i, r in enumerate(self.trace.requests)}
        return self.own_ids.get(req.request_id)

    def samples(self, out: SchedulerOutput) -> Samples:
        """Candidates for every sequence the step computed, as many as the scheduler expects."""
        rand = self.rng.random
        vocab = self.vocab_size
        answers = self.answers
        samples: Samples = {}
        for group in out.groups:
            params = group.params
            answer = answers.get(group.request_id) if answers else None
            if answer is None and params.best_of == 1 and not params.use_beam_search:
                # The common case, kept short: one sequence, one token.
                samples[group.seqs[0].seq_id] = ([(int(rand() * vocab), -rand())] if self.draws_samples
                                                 else _CONSTANT)
                continue
            k = params.samples_per_sequence(group.first_step_pending)
            for seq in group.seqs:
                if seq.status is not _RUNNING:
                    continue
                if answer is not None:
                    samples[seq.seq_id] = [(answer[len(seq.token_ids) - seq.prompt_len], -1.0)]
                else:   # beams rank candidates by log-probability: make them distinct and negative
                    samples[seq.seq_id] = [(int(rand() * vocab), -rand()) for _ in range(k)]
        return samples

    def window_samples(self, groups: list[SequenceGroup], steps: int) -> list[tuple[list[int], list[float]]]:
        """What `samples` returns over `steps` consecutive decode steps of these groups
        (none forking, none finishing before the last), per running sequence in
        group order: (token ids, logprobs), one per step.

        The random draws come in the same order as step by step (steps, then
        groups, then sequences), so the generator ends in the same state.
        """
        out: list[tuple[list[int], list[float]]] = []
        drawing: list[tuple[list[int], list[float]]] = []
        constant = ([0] * steps, [0.0] * steps)   # shared: the window only reads it
        answers = self.answers
        for group in groups:
            params = group.params
            answer = answers.get(group.request_id) if answers else None
            if answer is None and params.best_of == 1 and not params.use_beam_search and not self.draws_samples:
                out.append(constant)
                continue
            for seq in group.seqs:
                if seq.status is _RUNNING:
                    if answer is not None:
                        done = len(seq.token_ids) - seq.prompt_len
                        out.append((answer[done:done + steps], [-1.0] * steps))
                    else:
                        out.append(([], []))
                        drawing.append(out[-1])
        if drawing:
            rand = self.rng.random
            vocab = self.vocab_size
            for _ in range(steps):
                for ids, logprobs in drawing:
                    ids.append(int(rand() * vocab))
                    logprobs.append(-rand())
        return out
