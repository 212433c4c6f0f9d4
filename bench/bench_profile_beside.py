"""A profile's decode step against the live engine's, timed step by step on this CPU.

`planner validate --reprofile` times its profile's points between the live run's steps. This bench
asks whether such a point prices the live step of the same shape: it runs a live engine on n greedy
requests and, after each of its decode steps, times the same decode shape (n sequences, the same
context) on two profile runners, in turns:

  copy     a runner over a random-weight copy of the model built for the profile, as the profile was
           timed before stop 64 (planner/profile/run.py's ProfileSession without `beside`);
  beside   a runner over the live engine's own loaded model (ModelRunner's `weights_of`), each with a
           KV cache of its own, as validate times it now.

It prints the mean live step (schedule, forward, sampling, update) and each runner's mean forward,
as ratios to the live step. A profile's step time adds its host and sampling parts (well under 1 ms
here) to the forward, so `beside` should come out at or just under x1.00.

    .venv/bin/python bench/bench_profile_beside.py [--model opt-125m] [--batches 1,2,4,5,8] [--steps 40]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.core.sampling_params import SamplingParams  # noqa: E402
from engine.deployment import Deployment  # noqa: E402
from engine.llm_engine import LLMEngine  # noqa: E402
from planner.profile import pieces  # noqa: E402
from planner.profile.checkpoints import model_folder  # noqa: E402
from planner.profile.run import ProfileOptions, ProfileSession  # noqa: E402

PROMPT_LEN = 30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="opt-125m")
    parser.add_argument("--batches", default="1,2,4,5,8", help="decode batch sizes, comma-separated")
    parser.add_argument("--steps", type=int, default=40, help="decode steps per batch size")
    args = parser.parse_args()
    options = ProfileOptions(Deployment(model=args.model, gpu="cpu", block_size=16), quick=True)
    copy = ProfileSession(options)                  # builds and loads its own copy, as before stop 64
    folder, _ = model_folder(args.model)
    engine = LLMEngine(folder, Deployment(model=args.model, gpu="cpu", dtype="float32"), device="cpu",
                       kv_cache_memory_bytes=1 << 30)
    beside = ProfileSession(options, beside=engine.runner)
    runners = {"copy": copy.runner, "beside": beside.runner}
    rng = random.Random(0)
    print(f"{args.model} on this CPU: a live decode step and the same shape on each profile runner, in turns")
    print(f"{'batch':>5s} {'live ms':>8s} {'copy ms':>8s} {'copy/live':>9s} {'beside ms':>9s} {'beside/live':>11s}")
    for batch in (int(b) for b in args.batches.split(",")):
        for i in range(batch):
            engine.add_request(f"b{batch}-{i}", {"prompt_token_ids": list(range(10, 10 + PROMPT_LEN))},
                               SamplingParams(temperature=0, max_tokens=args.steps + 4, ignore_eos=True))
        live: list[float] = []
        timed: dict[str, list[float]] = {name: [] for name in runners}
        turn = 0
        while engine.has_unfinished_requests():
            engine.step()
            step = engine.steps[-1]
            if step.prefill_tokens or step.num_seqs != batch:      # full decode steps only
                continue
            live.append(step.end - step.start)
            context = PROMPT_LEN + len(live) + 1                    # each sequence's, this step
            order = list(runners.items()) if turn % 2 == 0 else list(reversed(runners.items()))
            turn += 1
            for name, runner in order:
                seqs = pieces.decode_inputs(runner, batch, context, rng)
                start = time.perf_counter()
                runner.execute(seqs)
                timed[name].append(time.perf_counter() - start)
        base = statistics.mean(live)
        copy_ms, beside_ms = (statistics.mean(timed[name]) for name in ("copy", "beside"))
        print(f"{batch:5d} {1e3 * base:8.1f} {1e3 * copy_ms:8.1f} {copy_ms / base:9.3f} "
              f"{1e3 * beside_ms:9.1f} {beside_ms / base:11.3f}", flush=True)
    copy.close()
    beside.close()


if __name__ == "__main__":
    main()
