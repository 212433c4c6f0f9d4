"""Timing the engine's own pieces, exactly as LLMEngine.step runs them.

  forward   ModelRunner.execute (input preparation, the model with the paged
            kernels, the LM head) for a prefill or a decode batch
  host      Scheduler.schedule, building the SequenceInputs, Scheduler.update and
            the step's record, for a batch of N sequences (no model)
  sampling  engine.sampler.Sampler.sample over [N, vocab] fp32 logits, with
            greedy requests (the fast path) or temperature-1 requests
  swap      ModelRunner.swap_out / swap_in of N blocks
  copy      ModelRunner.copy_blocks of N (src, dst) pairs

Each timing does warm-up calls first (kernel selection, allocator growth, lazy
compilation), synchronizes the device around the timed call, and repeats.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable

import torch
from dataclasses import replace

from engine.core.block_manager import BlockManager
from engine.core.step import begin_step, end_step
from engine.model_runner import ModelRunner, SequenceInput
from engine.sampler import Sampler
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler, SchedulerConfig
from engine.core.sequence import SequenceGroup

HOST_PROMPT_LEN = 32     # prompt length of the requests the host-side timing schedules
HOST_MAX_MODEL_LEN = 4096


def time_call(fn: Callable[[object], object], *, warmup: int, repeats: int,
              sync: Callable[[], None] = lambda: None,
              setup: Callable[[], object] = lambda: None) -> list[float]:
    """Seconds of `repeats` calls of fn(setup()) after `warmup` untimed ones; setup is not timed."""
    for _ in range(warmup):
        fn(setup())
        sync()
    samples = []
    for _ in range(repeats):
        arg = setup()
        sync()
        start = time.perf_counter()
        fn(arg)
        sync()
        samples.append(time.perf_counter() - start)
    return samples


def summarize(samples: list[float]) -> tuple[float, float]:
    """(median, spread): spread is (p90 - p10) / median, 0 for a single sample."""
    median = statistics.median(samples)
    if len(samples) < 2 or median <= 0:
        return median, 0.0
    ordered = sorted(samples)
    p10 = ordered[int(0.1 * (len(ordered) - 1))]
    p90 = ordered[round(0.9 * (len(ordered) - 1))]
    return median, (p90 - p10) / median


# -- forward -------------------------------------------------------------------

def prefill_inputs(runner: ModelRunner, tokens: int, seqs: int, rng: random.Random,
                   context: int = 0) -> list[SequenceInput]:
    """`seqs` prompts of tokens // seqs new tokens, each after `context` cached ones (0: fresh prompts), each
    in its own blocks (wrapping if the cache is small). The cached keys are whatever the blocks hold: what
    is timed is reading them back, not their values."""
    length, bs = tokens // seqs, runner.block_size
    per_seq = -(-(context + length) // bs)
    return [SequenceInput([rng.randrange(runner.vocab_size) for _ in range(length)], context,
                          [(i * per_seq + j) % runner.num_gpu_blocks for j in range(per_seq)])
            for i in range(seqs)]


def decode_inputs(runner: ModelRunner, batch: int, context: int, rng: random.Random) -> list[SequenceInput]:
    """`batch` sequences each computing one token on top of context - 1 cached ones, distinct blocks."""
    per_seq = -(-context // runner.block_size)
    return [SequenceInput([rng.randrange(runner.vocab_size)], context - 1,
                          list(range(i * per_seq, (i + 1) * per_seq)))
            for i in range(batch)]


def time_forward(runner: ModelRunner, seqs: list[SequenceInput], sync, warmup: int, repeats: int) -> list[float]:
    return time_call(lambda _: runner.execute(seqs), warmup=warmup, repeats=repeats, sync=sync)


def time_lora(runner: ModelRunner, seqs: list[SequenceInput], adapters: int, sync) -> list[float]:
    """One repetition of what `adapters` LoRA adapters add to a forward pass over `seqs` (the sequences
    take adapters 1..adapters in turn, loaded beforehand): the pass with them less the same pass without,
    timed back to back so the device's drift cancels."""
    tagged = [replace(s, lora_id=1 + i % adapters) for i, s in enumerate(seqs)]
    base = time_forward(runner, seqs, sync, 0, 1)[0]
    return [time_forward(runner, tagged, sync, 0, 1)[0] - base]


def time_mixed_decode(runner: ModelRunner, chunk: list[SequenceInput], decodes: list[SequenceInput],
                      sync) -> list[float]:
    """One repetition of what `decodes` add to a forward pass over the prompt `chunk` (a chunked-prefill
    step, the engine's mixed batch: the chunk's tokens packed first): the pass over both less the chunk's
    pass alone, timed back to back so the device's drift cancels."""
    base = time_forward(runner, chunk, sync, 0, 1)[0]
    return [time_forward(runner, chunk + decodes, sync, 0, 1)[0] - base]


def time_swap(runner: ModelRunner, blocks: int, sync, warmup: int, repeats: int) -> list[float]:
    """One direction at a time, alternating out and in, as preemption and resumption do."""
    mapping = {i: i for i in range(blocks)}
    state = {"out": True}

    def alternate(_):
        (runner.swap_out if state["out"] else runner.swap_in)(mapping)
        state["out"] = not state["out"]
    return time_call(alternate, warmup=warmup, repeats=repeats, sync=sync)


def time_copy(runner: ModelRunner, blocks: int, sync, warmup: int, repeats: int) -> list[float]:
    pairs = [(i, blocks + i) for i in range(blocks)]
    return time_call(lambda _: runner.copy_blocks(pairs), warmup=warmup, repeats=repeats, sync=sync)


# -- host side -------------------------------------------------------------------

def _scheduler(batch: int, block_size: int, extra_tokens: int) -> tuple[Scheduler, BlockManager]:
    per_seq = -(-(HOST_PROMPT_LEN + extra_tokens) // block_size)
    allocator = BlockManager(block_size, batch * per_seq + 16)
    config = SchedulerConfig(max_model_len=HOST_MAX_MODEL_LEN, max_num_seqs=batch,
                             max_num_batched_tokens=max(HOST_MAX_MODEL_LEN, batch * HOST_PROMPT_LEN))
    scheduler = Scheduler(config, allocator)
    rng = random.Random(batch)
    for i in range(batch):
        prompt = [rng.randrange(1000) for _ in range(HOST_PROMPT_LEN)]
        scheduler.add(SequenceGroup(str(i), prompt, SamplingParams(temperature=0, max_tokens=HOST_MAX_MODEL_LEN // 2,
                                                                  ignore_eos=True), 0.0))
    return scheduler, allocator


def _engine_host_step(scheduler: Scheduler, allocator: BlockManager) -> None:
    """LLMEngine.step without the runner and the sampler (timed separately): the same core step helper."""
    step = begin_step(scheduler, 0.0, SequenceInput)
    end_step(scheduler, step, {s.seq_id: [(7, 0.0)] for s in step.out.seqs}, 0.0)


def time_host_prefill(batch: int, block_size: int, warmup: int, repeats: int) -> list[float]:
    """A prefill step admitting `batch` waiting requests (a fresh scheduler per call, built untimed)."""
    return time_call(lambda state: _engine_host_step(*state), warmup=warmup, repeats=repeats,
                     setup=lambda: _scheduler(batch, block_size, 1))


def time_host_decode(batch: int, block_size: int, warmup: int, repeats: int) -> list[float]:
    """A decode step of `batch` running sequences (each call advances them one token)."""
    scheduler, allocator = _scheduler(batch, block_size, warmup + repeats + 2)
    _engine_host_step(scheduler, allocator)           # the prefill that makes them all running
    return time_call(lambda _: _engine_host_step(scheduler, allocator), warmup=warmup, repeats=repeats)


def time_sampling(batch: int, vocab_size: int, device: torch.device, greedy: bool, sync,
                  warmup: int, repeats: int) -> list[float]:
    """Sampler.sample on a prefill step of `batch` requests, greedy or at temperature 1."""
    scheduler, _ = _scheduler(batch, 16, 1)
    params = SamplingParams(temperature=0.0 if greedy else 1.0, max_tokens=16, ignore_eos=True)
    for group in scheduler.waiting:
        group.params = params
    out = scheduler.schedule(0.0)
    sampler = Sampler(device, 0)
    generator = torch.Generator(device="cpu").manual_seed(batch)
    logits = torch.randn(batch, vocab_size, generator=generator).to(device)
    return time_call(lambda _: sampler.sample(out, logits), warmup=warmup, repeats=repeats, sync=sync)
