"""What users who wait for their answers change: the chatbot workload sent as an open loop against the same
trace with `--turns-after-answers` (workloads/sessions.py), Llama-3.1-8B on one H100 (docs/results.md).

The chatbot trace times a conversation's later turn by an estimate: the previous turn's arrival, its answer
at 20 tokens/s, then the user's think time (exponential, mean 10 s). An open loop sends the turn then, whether
the answer has ended or not; with --turns-after-answers the turn goes its think time after the answer the
simulated engine gave. Runs the planner's Python API (the measured cost model, vLLM v1's scheduler and its
H100 defaults) at each rate and prints one markdown table: the requests sent a second, the later turns sent
before the answer they continue had ended, the prefix-cache hit rate, TTFT and E2E, and the verdict's state.

    python bench/bench_turns_after_answers.py [--rates 16,24,32] [--duration 300] [--seed 0]
"""
from __future__ import annotations

import argparse
import time

from engine.deployment import Deployment
from planner import simulate

MODEL, GPU = "llama-3.1-8b", "h100-sxm"


def early_turns(records) -> tuple[int, int]:
    """(later turns sent before the turn before them had ended, later turns) of a chatbot run's records."""
    by_id = {r.request_id: r for r in records}
    early = later = 0
    for record in records:
        conversation, turn = record.request_id.rsplit("-", 1)
        if int(turn) == 0:
            continue
        later += 1
        early += record.arrival < by_id[f"{conversation}-{int(turn) - 1}"].finish
    return early, later


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="16,24,32", help="the trace's request rates (req/s), comma-separated")
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of conversations starting (300)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"## {MODEL} on one {GPU}, chatbot, conversations starting over {args.duration:g} s, seed {args.seed}\n")
    print("Steady window (planner/analysis/verdict.py): the requests sent a second, TTFT and E2E.\n")
    print("| rate (req/s) | turns sent | sent (req/s) | later turns sent before their answer | prefix hits | "
          "TTFT mean (s) | TTFT p99 (s) | E2E mean (s) | state | wall (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for rate in (float(r) for r in args.rates.split(",")):
        for after in (False, True):
            start = time.perf_counter()
            result = simulate(Deployment(model=MODEL, gpu=GPU, turns_after_answers=after), workload="chatbot",
                              rate=rate, duration=args.duration, seed=args.seed)
            doc = result.document()
            steady, verdict = doc["steady_state"], doc["verdict"]
            early, later = early_turns(result.sim.requests)
            print(f"| {rate:g} | {'after answers' if after else 'at trace times'} | "
                  f"{verdict['queue']['arrival_rate']:.1f} | {early:,} of {later:,} | "
                  f"{doc['prefix_cache_hit_rate']:.1%} | {steady['ttft_mean']:.3f} | {steady['ttft_p99']:.2f} | "
                  f"{steady['e2e_mean']:.2f} | {verdict['state']} | {time.perf_counter() - start:.1f} |")


if __name__ == "__main__":
    main()
