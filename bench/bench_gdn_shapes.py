"""GDN head shapes NVIDIA never timed: how well a timed shape prices them, leaving each timed shape out.

planner/cost/measured_gdn.py prices an untimed per-GPU head shape from the timed shape with the same
key/value head ratio nearest in value heads: its b sequences at the timed shape's b x (value heads ratio)
sequences (the kernels work per sequence and value head). This bench hides each timed shape in turn,
prices it so (GdnKernels.without_own) and prints the factor between that price and the shape's own
table, max(priced/timed, timed/priced), for one GDN layer: decoding 1-256 sequences, and prefilling
1k-8k tokens as one sequence and as 8. Beside it, the same neighbour's latency at b sequences times the
value-head ratio (scaling the time, not the batch). Per system: mean / worst factor, and the worst case.

    .venv/bin/python bench/bench_gdn_shapes.py
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from planner.cost.measured_gdn import GdnKernels, timed_shapes  # noqa: E402
from planner.cost.tables import systems  # noqa: E402

DECODE_SEQS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PREFILL = tuple((seqs, tokens) for seqs in (1, 8) for tokens in (1024, 2048, 4096, 8192))
PHASES = ("decode", "prefill")


def _factor(priced: float, timed: float) -> float:
    return max(priced / timed, timed / priced)


def factors(system: str, shape: tuple[int, int, int, int]) -> dict:
    """{(method, phase): [(factor, where)]} for one hidden shape; method `batch` is the module's pricing,
    `time` the neighbour's own latency times the value-head ratio."""
    own, priced = GdnKernels.load(system, *shape), GdnKernels.without_own(system, *shape)
    neighbour = GdnKernels.load(system, *priced.timed)
    heads = shape[1] / priced.timed[1]
    name = f"{shape[:2]} from {priced.timed[:2]}"
    queries = {"decode": [((seqs,), f"decode {seqs}") for seqs in DECODE_SEQS],
               "prefill": [((seqs, tokens), f"prefill {seqs} x {tokens // seqs}") for seqs, tokens in PREFILL]}
    out: dict = {}
    for phase in PHASES:
        price = getattr(priced, phase)
        for query, where in queries[phase]:
            timed = getattr(own, phase)(*query)[0]
            for method, value in (("batch", price(*query)[0]),
                                  ("time", getattr(neighbour, phase)(*query)[0] * heads)):
                factor = _factor(value, timed)
                out.setdefault((method, phase), []).append((factor, f"{name}, {where}: x{value / timed:.2f}"))
    return out


def main() -> None:
    print("leave-one-out: each timed GDN head shape priced from the others; factor = max(priced/timed, inverse)")
    print(f"{'system':20s} {'shapes':>6s}  {'decode 1-256':>14s} {'prefill 1k-8k':>14s}"
          f"  | latency x heads: {'decode':>12s} {'prefill':>12s}")
    worst_cases = []
    for system in systems():
        shapes = timed_shapes(system)
        if not shapes:
            continue
        found: dict = {}
        for shape in shapes:
            for key, values in factors(system, shape).items():
                found.setdefault(key, []).extend(values)
        cells = []
        for method in ("batch", "time"):
            for phase in PHASES:
                values = [f for f, _ in found[(method, phase)]]
                cells.append(f"{sum(values) / len(values):.3f} / {max(values):.2f}")
                if method == "batch":
                    worst_cases.append(f"{system} {max(found[(method, phase)])[1]}")
        print(f"{system:20s} {len(shapes):6d}  {cells[0]:>14s} {cells[1]:>14s}  | {'':17s}{cells[2]:>12s} {cells[3]:>12s}")
    print("worst cases (the module's pricing):")
    for line in worst_cases:
        print(f"  {line}")


if __name__ == "__main__":
    main()
