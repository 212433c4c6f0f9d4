"""NVIDIA's measured vLLM op tables, made monotone, and log-space interpolation over their grids.

The tables (planner/data/measured/<system>/*.csv.gz) are rows of
aiconfigurator-core's parquet files, extracted by
scripts/extract_measured_tables.py with their provenance in
planner/data/measured/SOURCE.json. Latencies grow roughly as powers of their
arguments (linear in tokens once compute-bound, flat while launch-bound), so we
interpolate log(latency) linearly in log(argument): exact on grid points,
exact for any power law between them. Outside the grid the nearest segment is
extended and the lookup says so (`extrapolated`), so a result can name what it
guessed.

Monotone first. Time must not fall as work grows, yet many raw points sit
above a larger neighbour (on h100_sxm half the GEMM points, a quarter of
generation attention, 4% of context attention). Two causes show in the data:
timing jitter in launch-bound runs (GEMM n=51200, k=512: 20.4-23.9 us over
m=1..17, in no order), and shapes for which the library picked a slower
kernel than for the next larger one (same GEMM: 58 us at m=193, 33 us at
m=224; n=1024, k=12288: 52 us at m=768, 31 us at m=769). `monotone` fits each
table by isotonic regression of log latency (least squares, pool adjacent
violators) along each monotone axis: a point consistent with its line stays
exactly as measured (across both axes of a table, 98.9-99.9% of such points
on h100_sxm and l40s), a violating run moves to its geometric mean, the least
change in squared log error (the maximum-likelihood monotone table under
multiplicative noise). So "exact on grid points" holds for consistent points
and, for the rest, on the fitted table. It replaced a running-minimum
envelope (each point lowered to the least latency at any larger size), which
moved fewer points but further and always down, biasing the model fast:
|fit / raw - 1| on h100_sxm GEMMs, p90 6.2% and max 35% against 8.6% and 43%
(generation attention 1.0%/17% against 1.6%/22%; every table and system in
bench/bench_measured_model.py); decode steps of llama-3.1-8b at batch
1-128 are 0.6-5.9% slower than with the envelope. The fit's weakness is an
extreme lone outlier, which lifts the larger points it pools with (l40s,
n=512, k=32: 46 us at m=512 among 2.3-2.8 us neighbours; the fit puts it at
3.0 us and lifts m=513..1025 by 15-30%). A least-absolute-deviation fit
(block medians) would leave those alone, but its solution is not unique and
the axis-by-axis fit does not settle on every table.
"""
from __future__ import annotations

import csv
import gzip
import io
import json
import math
from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from planner.errors import PlannerError

TABLES = ("gemm", "gemm_fp8", "gemm_nvfp4", "context_attention", "generation_attention",
          "context_attention_fp8kv", "generation_attention_fp8kv", "allreduce")


@lru_cache(maxsize=1)
def source() -> dict:
    """Provenance of every extracted table (package, version, file, sha256, vLLM version)."""
    text = resources.files("planner").joinpath("data/measured/SOURCE.json").read_text(encoding="utf-8")
    return json.loads(text)


def systems() -> tuple[str, ...]:
    return tuple(source()["systems"])


def has_table(system: str, table: str) -> bool:
    """Whether the system's data holds `table` (the FP8 and FP4 tables exist where NVIDIA measured them)."""
    return table in source()["systems"].get(system, {}).get("tables", {})


# Columns that hold names, not numbers: the all-reduce's backend, the MoE table's expert format and routing,
# the GDN table's kernel (conv or delta_rule) and phase (context or generation), the DSA tables' model (its
# Hugging Face id), cache dtype and GEMM format.
TEXT_COLUMNS = ("backend", "moe_dtype", "distribution", "kernel", "phase", "model", "kv_cache_dtype", "gemm_type")


@lru_cache(maxsize=None)
def load_rows(system: str, table: str) -> tuple[dict, ...]:
    """One extracted table as rows of numbers (ints for grid axes, float latency in seconds)."""
    if system not in source()["systems"]:
        raise PlannerError(f"no measured vLLM data for system {system!r}; covered: {', '.join(systems())}")
    path = resources.files("planner").joinpath(f"data/measured/{system}/{table}.csv.gz")
    try:
        text = gzip.decompress(path.read_bytes()).decode("utf-8")
    except (OSError, EOFError) as exc:
        raise PlannerError(f"measured table {system}/{table}.csv.gz is unreadable ({exc})") from None
    rows = []
    for row in csv.DictReader(io.StringIO(text)):
        out = {k: (v if k in TEXT_COLUMNS else int(v)) for k, v in row.items() if k != "latency_ms"}
        out["latency"] = float(row["latency_ms"]) * 1e-3
        rows.append(out)
    return tuple(rows)


def _log(x: float) -> float:
    return math.log(x if x > 0 else 1e-30)


@dataclass(frozen=True)
class Curve:
    """latency(x) through measured points, interpolated linearly in log-log space."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.xs or len(self.xs) != len(self.ys):
            raise PlannerError("a measured curve needs at least one point")

    @classmethod
    def of(cls, points: dict[float, float]) -> "Curve":
        xs = tuple(sorted(points))
        return cls(xs, tuple(points[x] for x in xs))

    def at(self, x: float) -> tuple[float, bool]:
        """(latency, extrapolated): exact on a grid point; outside the grid, the edge segment extended."""
        xs, ys = self.xs, self.ys
        outside = x < xs[0] or x > xs[-1]
        if len(xs) == 1:
            return ys[0], outside
        i = segment_start(xs, x)
        return _segment(x, xs[i], xs[i + 1], ys[i], ys[i + 1]), outside


def segment_start(keys, x: float) -> int:
    """The index of the first of the two sorted grid values (at least two) whose segment prices x: the pair
    around it, or the edge pair outside the grid."""
    return min(max(bisect_right(keys, x) - 1, 0), len(keys) - 2)


def _segment(x: float, x0: float, x1: float, y0: float, y1: float) -> float:
    """The line through (x0, y0) and (x1, y1) in log-log space, at x (exact at either end)."""
    if x == x0 or x == x1:
        return y0 if x == x0 else y1
    t = (_log(x) - _log(x0)) / (_log(x1) - _log(x0))
    return math.exp(_log(y0) + t * (_log(y1) - _log(y0)))


def interpolate(tree: dict, query: tuple[float, ...]) -> tuple[float, bool]:
    """Nested dict tree[a0][a1]...[an] = latency, queried at one value per axis.

    Axis by axis: along the first axis take the two grid values that bracket
    the query (or the two at the edge), interpolate each sub-table at the rest
    of the query, then interpolate between them in log-log space. Sub-tables may
    have different grids (a missing corner is skipped, not invented). (A cost
    model's cache misses call this thousands of times a run: no objects are made.)
    """
    x, rest = query[0], query[1:]
    keys = sorted(tree)
    if len(keys) == 1:
        only = keys[0]
        y, ext = interpolate(tree[only], rest) if rest else (tree[only], False)
        return y, ext or x != only
    i = segment_start(keys, x)
    lo, hi = keys[i], keys[i + 1]
    if not rest:                       # the last axis: the curve's own segment
        return _segment(x, lo, hi, tree[lo], tree[hi]), x < keys[0] or x > keys[-1]
    y0, e0 = interpolate(tree[lo], rest)
    if x == lo:
        return y0, e0
    y1, e1 = interpolate(tree[hi], rest)
    return _segment(x, lo, hi, y0, y1), x < lo or x > hi or e0 or e1


def build_tree(rows, axes: tuple[str, ...], where: dict | None = None) -> dict:
    """Rows matching `where`, nested along `axes` (the last axis maps to latency)."""
    tree: dict = {}
    for row in rows:
        if where and any(row[k] != v for k, v in where.items()):
            continue
        node = tree
        for axis in axes[:-1]:
            node = node.setdefault(row[axis], {})
        node[row[axes[-1]]] = row["latency"]
    return tree


def isotonic(points: dict) -> dict:
    """The nondecreasing fit to latency(x) closest to the points in log space
    (least squares on log latency, by pool-adjacent-violators).

    Points that already agree with every other stay as measured; a run of
    points that violates the order is replaced by its geometric mean, the
    smallest correction in the sense of squared log error.
    """
    xs = sorted(points)
    blocks: list[list[float]] = []          # [sum of log latencies, count], values nondecreasing
    for x in xs:
        blocks.append([math.log(points[x]), 1])
        while len(blocks) > 1 and blocks[-2][0] * blocks[-1][1] > blocks[-1][0] * blocks[-2][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    fitted: list[float] = []
    for total, count in blocks:
        value = points[xs[len(fitted)]] if count == 1 else math.exp(total / count)
        fitted += [value] * count
    return dict(zip(xs, fitted))


def _is_monotone(points: dict) -> bool:
    """Nondecreasing, up to rounding: a run pooled along rows and again along columns can come back a last
    bit apart (exp of a mean of logs), which no further round settles."""
    xs = sorted(points)
    return all(points[a] <= points[b] * (1 + 1e-12) for a, b in zip(xs, xs[1:]))


def monotone(tree: dict, depth: int) -> dict:
    """The same tree made nondecreasing along its innermost axis and, for two-level
    trees, along the outer one too, by isotonic regression in log space (see
    the module docstring). Rows first, then columns: isotonic regression is
    order-preserving, so fitting the columns of a row-monotone table keeps its
    rows monotone; a ragged grid may need another round.
    """
    if depth == 1:
        return isotonic(tree)
    if depth > 2:
        return {k: monotone(v, depth - 1) for k, v in tree.items()}
    rows = {k: dict(v) for k, v in tree.items()}
    for _ in range(100):
        rows = {k: isotonic(v) for k, v in rows.items()}
        columns: dict = {}
        for key, row in rows.items():
            for x, y in row.items():
                columns.setdefault(x, {})[key] = y
        for x, column in columns.items():
            for key, y in isotonic(column).items():
                rows[key][x] = y
        if all(_is_monotone(row) for row in rows.values()):
            return rows
    raise PlannerError("a measured table could not be made monotone")


def leave_one_out(tree: dict, depth: int) -> list[float]:
    """Relative errors of predicting each interior point of the last axis from its neighbours."""
    if depth > 1:
        errors: list[float] = []
        for sub in tree.values():
            errors += leave_one_out(sub, depth - 1)
        return errors
    xs = sorted(tree)
    errors = []
    for j in range(1, len(xs) - 1):
        curve = Curve((xs[j - 1], xs[j + 1]), (tree[xs[j - 1]], tree[xs[j + 1]]))
        guess, _ = curve.at(xs[j])
        errors.append(abs(guess / tree[xs[j]] - 1))
    return errors
