"""Sampler: logits of one step -> the candidates the scheduler applies.

Per sequence it returns ``params.samples_per_sequence(first_step)`` pairs
``(token_id, logprob)``: one token for plain decoding, ``best_of`` draws on a
request's first step (the scheduler forks them into sequences), the top
``2 * width`` continuations for beam search. Log-probabilities are those of
the model's distribution (before temperature), as transformers' beam search
scores them.
"""
from __future__ import annotations

import torch

from engine import sampling
from engine.core.scheduler import Samples, SchedulerOutput
from engine.core.sequence import SequenceGroup


class Sampler:
    def __init__(self, device: torch.device, seed: int) -> None:
        self.device = device
        # Requests without a seed draw from one engine-wide generator.
        self.shared = sampling.make_generator(seed, device)
        self.generators: dict[str, torch.Generator] = {}

    def _generator(self, group: SequenceGroup) -> torch.Generator:
        seed = group.params.seed
        if seed is None:
            return self.shared
        gen = self.generators.get(group.request_id)
        if gen is None:
            gen = self.generators[group.request_id] = sampling.make_generator(seed, self.device)
        return gen

    def forget(self, group: SequenceGroup) -> None:
        self.generators.pop(group.request_id, None)

    def sample(self, out: SchedulerOutput, logits: torch.Tensor) -> Samples:
        rows: list[tuple[int, SequenceGroup, int]] = []   # (seq id, group, candidates wanted)
        seq_group = {s.seq_id: g for g in out.groups for s in g.seqs}
        for seq in out.seqs:
            group = seq_group[seq.seq_id]
            rows.append((seq.seq_id, group, group.params.samples_per_sequence(group.first_step_pending)))

        # Fast path: plain greedy decoding without logprobs.
        if all(k == 1 and g.params.greedy and g.params.logprobs is None for _, g, k in rows):
            tokens = sampling.greedy(logits).tolist()
            return {seq_id: [(tok, 0.0)] for (seq_id, _, _), tok in zip(rows, tokens)}

        logprobs = sampling.logprobs(logits)
        samples: Samples = {}
        for row, (seq_id, group, k) in enumerate(rows):
            params = group.params
            if params.use_beam_search:
                values, ids = logprobs[row].topk(k)
                samples[seq_id] = list(zip(ids.tolist(), values.tolist()))
                continue
            if params.greedy:
                token = int(logits[row].argmax())
                tokens = [token] * k
            else:
                gen = self._generator(group)
                row_logits = logits[row:row + 1].expand(k, -1)
                tokens = sampling.sample(row_logits, params.temperature, params.top_k, params.top_p,
                                         [gen] * k).tolist()
            row_logprobs = logprobs[row]
            samples[seq_id] = [(t, float(row_logprobs[t])) for t in tokens]
        return samples
