"""Speculative decoding in the simulator: the acceptance curve, the drafts, the verify step's price.

The simulator runs the engine's own scheduler with speculation on (its lookahead slots, its token
budget with the drafts in it, ``BlockManager.trim`` giving the rejected drafts' slots back, its
``SpecDecodingStats``); only two things are synthetic, as tokens are everywhere in the simulator:

- the drafts: `SimProposer` proposes k placeholder tokens for every sequence that can speculate,
  under the same caps as the engine's ``NgramProposer`` (k, the request's ``max_tokens``, the
  context limit ``max_model_len - 1``, ``can_speculate``); the scheduler then cuts them to the
  step's budget or the free blocks exactly as it cuts real ones;
- the verdict: `SpeculatingExecutor` draws, per verifying sequence, how many drafts the target
  model accepts, position by position from the curve's conditional rates (position i is tried
  only when positions 1..i-1 were accepted). The sequence then gets the accepted drafts and one
  more token, as the engine's sampler returns them.

Both draw from `StratifiedUniforms`, seeded from the run's seed (deterministic per seed): each
verdict and each draft length takes one uniform and inverts the curve's law (`_run_length` in
planner/deploy/speculation.py), and each block of STRATA uniforms holds one from each of STRATA
equal slices of [0, 1), in random order. The law of a single draw is the curve's; what changes is
the run's total: with independent draws a 56-request validation's accepted drafts varied with a
standard deviation of 6% of their mean across seeds (20 seeds, 450 accepted), so one simulation
could miss its live run's acceptance length by 10% by chance alone; stratified, the share of
draws landing on each outcome is within one draw per block of the curve's.

The acceptance curves, their sources and the checks of a deployment's speculation live in
planner/deploy/speculation.py (`speculation_of`).

Prices (`SpecRuntime`):

- the verify step: each verifying sequence computes k + 1 tokens, the last token and each draft
  at consecutive positions (row j attends to its context and rows 0..j); `spec_step_shape`
  describes it as one decode sequence at its last row's context with k draft tokens
  (StepShape.draft_tokens, draft_keys), so each cost model prices it as its runtime runs it:
  vLLM's (measured, roofline) with the sequence's keys read once by one attention program over
  its k + 1 query rows and every row through the GEMMs, the LM head and the sampler; this
  project's engine (calibrated) as k + 1 decode rows, each reading its own context;
- the proposer, per step with drafts: ngram a constant (`NGRAM_PROPOSE_SECONDS`, the engine's own
  proposer on one 1,024-token sequence, measured); a network (a draft model, `--draft-model`, or an
  EAGLE or MTP head: planner/deploy/speculation.py, `proposer_model`) its own passes, priced by the
  same kind of cost model on the same GPUs, as vLLM runs them (vllm/v1/spec_decode/eagle.py and
  draft_model.py): a first pass over each step's new tokens (its prefill of the prompts, the
  verified rows), which drafts the first token, then k - 1 one-token passes of the drafting
  sequences; each pass includes its LM head and sampler, not a step's host work.

Decode fast-forward is off while speculating (each step's tokens per sequence are random, which
the fast-forward proofs do not cover): the run is step by step, with the same rules.
"""
from __future__ import annotations

import random

from engine.core.speculative import SpeculativeConfig, draft_limit
from planner.cost.shape import StepShape, context_histogram, mixed_step_shape, reads_context_histogram, step_shape
from planner.cost.select import select_cost_model
from planner.deploy.speculation import Speculation, proposer_model
from planner.sim.synthetic import _CONSTANT, SyntheticExecutor

# The engine's n-gram proposer (engine/core/speculative.py) on one 1,024-token sequence, n in [2, 4],
# k = 4: 27 us on the shared development CPU; per step, whatever the batch (vLLM's is numba, threaded).
NGRAM_PROPOSE_SECONDS = 30e-6


# Uniforms per stratified block: large enough that a block's outcome shares match the curve to 1/64,
# small enough that a short run (a few hundred verdicts) is made of several complete blocks.
STRATA = 64


class StratifiedUniforms:
    """A stream of uniforms on [0, 1), called like ``random.random``: each block of STRATA consecutive
    values has one value in each slice [i / STRATA, (i + 1) / STRATA), at a random point in it and in
    random order (stratified sampling; the order keeps consecutive values nearly independent)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.block: list[float] = []

    def __call__(self) -> float:
        if not self.block:
            rand = self.rng.random
            self.block = [(i + rand()) / STRATA for i in range(STRATA)]
            self.rng.shuffle(self.block)
        return self.block.pop()


class SimProposer:
    """Placeholder drafts: at each lookup as many as the drafting curve draws (k without one), counted
    in the scheduler's stats and capped as the engine's NgramProposer caps its own (k, the request's
    max_tokens, max_model_len - 1, requests that can speculate)."""

    def __init__(self, spec: Speculation, max_model_len: int, stats, seed: int) -> None:
        self.spec = spec
        self.k = spec.k
        self.max_model_len = max_model_len
        self.stats = stats
        # One stream per state of the drafting chain, so each state's draws are stratified on their own.
        self.rand = {state: StratifiedUniforms(seed * 1_000_003 + 27 + 100 * state) for state in (False, True)}

    def propose(self, group, seq) -> list[int]:
        limit = draft_limit(group, seq, self.k, self.max_model_len)
        if limit <= 0:
            return []
        length = self.spec.draw_draft_length(self.rand[seq.last_lookup_drafted], seq.last_lookup_drafted)
        self.stats.observe_lookup(length, seq.last_lookup_drafted)
        seq.last_lookup_drafted = length > 0
        return [0] * min(length, limit)


def enable(scheduler, spec: Speculation, seed: int) -> None:
    """Turn on the engine scheduler's speculation (its counters) with the simulator's proposer."""
    scheduler.enable_speculation(SpeculativeConfig("ngram", spec.k))
    scheduler.proposer = SimProposer(spec, scheduler.config.max_model_len, scheduler.spec_stats, seed)


class SpeculatingExecutor(SyntheticExecutor):
    """The synthetic executor, with the target model's verdict on each sequence's drafts drawn from
    the acceptance curve (its own stratified stream, seeded by the run's seed)."""

    def __init__(self, trace, *, vocab_size: int, seed: int, real_token_ids: bool, spec: Speculation) -> None:
        super().__init__(trace, vocab_size=vocab_size, seed=seed, real_token_ids=real_token_ids)
        self.spec = spec
        # One stream per number of drafts verified, so the verdicts on each are stratified on their own.
        self.accept = [StratifiedUniforms(seed * 1_000_003 + 26 + 100 * n) for n in range(spec.k + 1)]

    def samples(self, out):
        samples = super().samples(out)
        spec = out.spec_token_ids
        if not spec:
            return samples
        draw, accept = self.spec.draw, self.accept
        rand, vocab, answers = self.rng.random, self.vocab_size, self.answers
        for group in out.groups:
            seq = group.seqs[0]
            drafts = spec.get(seq.seq_id)
            if not drafts:
                continue
            n = draw(accept[len(drafts)], len(drafts)) + 1                 # accepted drafts and one token of the target's
            answer = answers.get(group.request_id) if answers else None
            if answer is not None:
                done = len(seq.token_ids) - seq.prompt_len
                samples[seq.seq_id] = [(t, -1.0) for t in answer[done:done + n]]
            elif self.real_token_ids:
                samples[seq.seq_id] = samples[seq.seq_id] + [(int(rand() * vocab), -rand()) for _ in range(n - 1)]
            else:
                samples[seq.seq_id] = _CONSTANT * n
        return samples


def spec_step_shape(out, histogram: bool = True) -> StepShape:
    """StepShape of a step that verifies drafts: a sequence verifying d drafts is a decode sequence at
    its last row's context with d draft tokens (StepShape.draft_tokens and draft_keys); other
    sequences as `step_shape` counts them. Without drafts: `step_shape`."""
    spec = out.spec_token_ids
    if not spec:
        return step_shape(out, histogram)
    swap = len(out.blocks_to_swap_in) + len(out.blocks_to_swap_out)
    shape = mixed_step_shape(out.seqs, out.scheduled_tokens(), swap, len(out.blocks_to_copy), histogram, spec)
    shape.offload_blocks = len(out.kv_loads) + len(out.kv_stores)
    return shape


def draft_cost_model(plan):
    """The cost model pricing the proposer's passes (a draft model or an EAGLE/MTP head; None for ngram):
    the kind that prices the target (a calibrated profile of it if there is one, else NVIDIA's tables,
    else the roofline), on the same GPUs."""
    proposer = proposer_model(plan.deployment, plan.model)
    if proposer is None:
        return None
    d = plan.deployment
    # Host time in series: `_draft_pass` takes it out, leaving the draft's GPU time (hidden or not, the
    # host's share is the target step's).
    return select_cost_model(proposer[0], plan.gpu, tp=d.tp, dtype_bytes=plan.dtype_bytes, block_size=d.block_size,
                             kv_cache_dtype=d.kv_cache_dtype, async_scheduling=False, node_link=d.node_link,
                             custom_all_reduce=not d.disable_custom_all_reduce, performance_mode=d.performance_mode)


class SpecRuntime:
    """What a simulated engine needs while speculating: the shape of a step and the proposer's price."""

    def __init__(self, spec: Speculation, cost_model, draft_cost=None) -> None:
        self.spec = spec
        self.cost_model = cost_model
        self.draft_cost = draft_cost
        self.histogram = reads_context_histogram(cost_model)
        self.proposer_time = 0.0          # seconds of all the steps spent proposing (in their prices)

    def shape(self, out, histogram: bool) -> StepShape:
        return spec_step_shape(out, histogram)

    def proposer_seconds(self, out, shape: StepShape) -> float:
        """The proposer's price in a step (drafts for the next step are made right after this one's
        verdict, so a step with drafts is charged for a round of proposals). A draft model or head also
        runs every step's new tokens (prompt chunks, verified rows) through itself, drafts or not."""
        if self.draft_cost is not None:
            seconds = self._draft_model_seconds(out, shape)
        elif not out.spec_token_ids:
            return 0.0
        else:
            seconds = NGRAM_PROPOSE_SECONDS
        self.proposer_time += seconds
        return seconds

    def _drafting(self, out) -> StepShape:
        """One decode row per drafting sequence, at its context."""
        drafting = [s for s in out.seqs if s.seq_id in out.spec_token_ids]
        contexts = [s.num_computed_tokens + 1 for s in drafting]
        return StepShape(decode_seqs=len(contexts), decode_context=sum(contexts),
                         decode_histogram=context_histogram(contexts) if self.histogram else ())

    def _draft_model_seconds(self, out, shape: StepShape) -> float:
        """The proposer's first pass over the step's tokens (its own prefill of the prompts and the
        verified rows: the target's shape), then k - 1 decode passes of the drafting sequences. The first
        pass's LM head is priced over the shape's logit rows, where vLLM takes one per sequence: an
        overestimate once the head's GEMM is compute-bound (large batches)."""
        seconds = self._draft_pass(shape, len(out.seqs)) if shape.prefill_tokens or shape.decode_seqs else 0.0
        spec = out.spec_token_ids
        if spec:
            seconds += (max(len(d) for d in spec.values()) - 1) * self._draft_pass(self._drafting(out), len(spec))
        return seconds

    def _draft_pass(self, shape: StepShape, seqs: int) -> float:
        """One forward pass of the draft model: its step's price less the host work a step of its own
        would have (scheduling, input preparation, output processing), which runs once per target step
        (cost models that price the host separately: the measured one; others keep it, an overestimate).
        The drafter runs on the GPU after the target's forward, so its time adds to the step's, with async
        scheduling too (the host's work then hides behind the target's GPU time only: a bound)."""
        seconds = self.draft_cost.step_time(shape)
        host = getattr(self.draft_cost, "host", None)
        if host is not None:
            seconds -= host(seqs)
        return seconds
