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

    def verify(self, out: SchedulerOutput, logits: torch.Tensor, num_rows: list[int],
               zero_logprobs: bool) -> Samples:
        """Speculative decoding: for each sequence of ``out`` with drafts (``out.spec_token_ids``),
        its ``1 + k`` logit rows (``num_rows``, rows of one sequence together) verify its k drafts.

        Position i draws its token exactly as a plain decode step would (argmax when greedy, else
        one multinomial draw from the request's generator after temperature, top-k and top-p);
        a draft is accepted when it equals that token, and the first mismatch ends the sequence's
        tokens with the drawn token. For a deterministic proposal (a point mass on draft d) this
        IS speculative sampling's rule: d is accepted with probability p(d), and a rejection
        returns a token distributed as p restricted to tokens other than d, renormalized, which
        is the residual norm((p - onehot(d))+). Each output token consumes one draw, as without
        speculation, so a seeded request samples the very tokens it would have without it.

        Returns per sequence the accepted drafts and the token after them. Log-probabilities are
        the model's (before temperature), or 0.0 where the plain sampler's greedy fast path
        would have reported 0.0 (``zero_logprobs``)."""
        spec = out.spec_token_ids
        seq_group = {s.seq_id: g for g in out.groups for s in g.seqs}
        samples: Samples = {}
        start = 0
        for seq, rows in zip(out.seqs, num_rows):
            block = logits[start:start + rows]
            start += rows
            drafts = spec[seq.seq_id]
            params = seq_group[seq.seq_id].params
            tokens: list[int] = []
            if params.greedy:
                picks = sampling.greedy(block).tolist()
                for i, tok in enumerate(picks):
                    tokens.append(tok)
                    if i == len(drafts) or tok != drafts[i]:
                        break
            else:
                gen = self._generator(seq_group[seq.seq_id])
                for i in range(rows):
                    tok = int(sampling.sample(block[i:i + 1], params.temperature, params.top_k, params.top_p,
                                              [gen])[0])
                    tokens.append(tok)
                    if i == len(drafts) or tok != drafts[i]:
                        break
            if zero_logprobs:
                samples[seq.seq_id] = [(t, 0.0) for t in tokens]
            else:
                lp = sampling.logprobs(block[:len(tokens)])
                samples[seq.seq_id] = [(t, float(lp[i, t])) for i, t in enumerate(tokens)]
        return samples
