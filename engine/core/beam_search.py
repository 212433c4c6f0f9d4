"""Beam search over a request's sequences, scored exactly as transformers' beam search.

The scheduler calls ``update_beams`` once per step of a beam-search request
with the top ``2k`` continuations of every live beam. Beams share KV blocks
through the allocator's fork (copy-on-write), so a beam chosen twice costs no
copy until the two diverge.
"""
from __future__ import annotations

from engine.core.kv_allocator import KVAllocator
from engine.core.sequence import (BeamHypothesis, FinishReason, Sequence, SequenceGroup,
                                  SequenceStatus, next_seq_id)
from engine.core.stopping import is_stop_token, stop_reason

Samples = dict[int, list[tuple[int, float]]]


def update_beams(group: SequenceGroup, samples: Samples, allocator: KVAllocator,
                 max_model_len: int) -> None:
    """One beam-search step.

    The top ``2k`` continuations over all beams are ranked by cumulative
    log-probability; those among the first ``k`` that end (stop token or
    length) become finished hypotheses scored sum_logprobs /
    generated_len ** length_penalty; the best ``k`` that do not end are the
    next beams (forking a beam chosen twice, freeing a beam not chosen).
    """
    params = group.params
    width = params.best_of
    live = [s for s in group.seqs if s.status is SequenceStatus.RUNNING]
    candidates = [(seq.cumulative_logprob + logprob, rank, seq, token, logprob)
                  for rank, seq in enumerate(live) for token, logprob in samples[seq.seq_id]]
    candidates.sort(key=lambda c: (-c[0], c[1]))
    candidates = candidates[:2 * width]
    gen_len = live[0].num_output_tokens + 1
    penalty = gen_len ** params.length_penalty
    chosen: list[tuple[Sequence, int, float]] = []
    for rank, (score, _, seq, token, logprob) in enumerate(candidates):
        if stop_reason(group, token, seq.num_tokens + 1, gen_len, max_model_len) is not None:
            if rank < width and group.beam_improvable:
                group.beams.append(BeamHypothesis(score / penalty, seq.token_ids + [token], score))
        elif len(chosen) < width:
            chosen.append((seq, token, logprob))
    group.beams.sort(key=lambda h: -h.score)
    del group.beams[width:]

    # Fork beams chosen more than once, drop beams not chosen.
    picks: dict[int, list[tuple[int, float]]] = {}
    for seq, token, logprob in chosen:
        picks.setdefault(seq.seq_id, []).append((token, logprob))
    next_beams: list[Sequence] = []
    for seq in live:
        mine = picks.get(seq.seq_id)
        if not mine:
            seq.finish(FinishReason.PRUNED, allocator)
            continue
        for token, logprob in mine[1:]:
            child = seq.copy_as(next_seq_id())
            allocator.fork(seq, child)
            child.append(token, logprob)
            next_beams.append(child)
        seq.append(*mine[0])
        next_beams.append(seq)
    # Keep the beams in rank order (best first), as transformers does.
    group.seqs = sorted(next_beams, key=lambda s: -s.cumulative_logprob)
    # Stop once no running beam can beat the worst kept hypothesis
    # (transformers' default early_stopping=False heuristic).
    if chosen and group.beam_improvable and len(group.beams) >= width:
        if group.seqs[0].cumulative_logprob / penalty <= group.beams[-1].score:
            group.beam_improvable = False
    if not chosen or not group.beam_improvable:
        for seq in group.seqs:
            seq.finish(FinishReason.PRUNED, allocator)
        last = group.beams[0].token_ids[-1] if group.beams else None
        stopped = last is not None and is_stop_token(group, last)
        group.finish_reason = FinishReason.STOP if stopped else FinishReason.LENGTH


def beams_from_live(group: SequenceGroup) -> None:
    """A beam search ended early (truncated) keeps its live beams as its results."""
    if group.params.use_beam_search and not group.beams:
        group.beams = [BeamHypothesis(s.cumulative_logprob, list(s.token_ids), s.cumulative_logprob)
                       for s in group.seqs]
