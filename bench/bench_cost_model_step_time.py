"""Cost of one `step_time` call: the simulator asks it once per simulated step.

Moved here from the test suite (a wall-clock bound is a measurement, not a
pass/fail test on a shared machine). Prints microseconds per call for the
roofline model and, when the shipped CPU profile is present, the calibrated
model, over the same mix of decode and prefill shapes, side by side in one run.
Target: at most 20 us per call.

    .venv/bin/python bench/bench_cost_model_step_time.py [--rounds 500]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from planner.cost import RooflineCostModel, StepShape, prefill_attn_pairs  # noqa: E402

TARGET_US = 20.0


def shapes() -> list[StepShape]:
    decode = [StepShape(decode_seqs=b, decode_context=b * 300) for b in range(1, 65)]
    prefill = [StepShape(prefill_seqs=1, prefill_tokens=n, prefill_attn_pairs=prefill_attn_pairs(n))
               for n in range(16, 2048, 64)]
    return decode + prefill


def per_call_us(model, mix: list[StepShape], rounds: int) -> float:
    step_time = model.step_time
    start = time.perf_counter()
    for _ in range(rounds):
        for shape in mix:
            step_time(shape)
    return (time.perf_counter() - start) / (rounds * len(mix)) * 1e6


def models():
    yield "roofline opt-66b / 4 x a100", RooflineCostModel("opt-66b", "a100", tp=4)
    yield "roofline opt-13b / a100-40g", RooflineCostModel("opt-13b", "a100")
    profile = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "profiles", "cpu", "opt-125m.json")
    if os.path.exists(profile):
        from planner.catalog import resolve_gpu, resolve_model
        from planner.cost.calibrated import CalibratedCostModel

        yield "calibrated opt-125m / cpu", CalibratedCostModel.from_file(
            profile, model=resolve_model("opt-125m"), gpu=resolve_gpu("cpu"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=500, help="passes over the shape mix")
    args = parser.parse_args()
    mix = shapes()
    print(f"{len(mix)} shapes x {args.rounds} rounds per model; target <= {TARGET_US:.0f} us per call")
    print(f"{'cost model':<32}{'us/call':>10}{'vs target':>12}")
    for label, model in models():
        us = per_call_us(model, mix, args.rounds)
        print(f"{label:<32}{us:>10.2f}{us / TARGET_US:>11.2f}x")


if __name__ == "__main__":
    main()
