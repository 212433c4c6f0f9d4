"""Searching a MoE's parallel layouts: data parallelism and expert parallelism as axes of `planner search`.

A MoE deployment of N = tp x dp GPUs can lay its experts out by width (vLLM's default) or whole
(--enable-expert-parallel), and can replicate attention dp times instead of splitting it tp ways
(planner/deploy/parallel.py). Each layout (dp, expert parallel) is searched as the usual grid of GPU,
TP, block size and max_num_seqs (planner/sizing/search.py), each row priced at its tp x dp GPUs; then the
grids are merged, each row tagged with its layout, and the best configuration and the Pareto front are
chosen over all layouts together.
A layout vLLM would refuse for a configuration (EP beyond the experts, a width tp x dp does not divide)
stays in the table with the reason, as any configuration that cannot run does. Expert parallelism is
tried only where it differs from the default: on more than one GPU, for a model with experts.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from planner.catalog import resolve_model
from planner.sizing.search import CSV_COLUMNS, LAYOUT_COLUMNS, SearchResult, choose_best, pareto_front

Layout = tuple                  # (dp, enable_expert_parallel)


def layouts_for(model: str, dps: tuple[int, ...], tps: tuple[int, ...],
                eps: tuple[bool, ...] = (False, True)) -> list[Layout]:
    """The (dp, expert parallel) layouts to search: every dp given; for a MoE, each with and without EP
    (or as `eps` says) where some configuration has more than one GPU."""
    moe = resolve_model(model).is_moe
    found = []
    for dp, ep in itertools.product(dps, eps):
        if ep and not (moe and max(tps) * dp > 1):
            continue
        found.append((dp, ep))
    return found


@dataclass
class LayoutSearchResult(SearchResult):
    """A search over layouts: its rows say their dp and expert parallelism, and cost tp x dp GPUs."""

    layouts: tuple[Layout, ...] = ()

    def columns(self) -> tuple[str, ...]:
        return CSV_COLUMNS[:2] + LAYOUT_COLUMNS + CSV_COLUMNS[2:]

    def document(self) -> dict:
        doc = super().document()
        if self.best is not None:
            doc["best"] = {**doc["best"], **{k: self.best[k] for k in LAYOUT_COLUMNS}}
        doc["layouts"] = [{"dp": dp, "enable_expert_parallel": ep} for dp, ep in self.layouts]
        return doc


def merge(results: list[tuple[Layout, SearchResult]]) -> LayoutSearchResult:
    """One result from a search per layout: rows tagged and priced at tp x dp GPUs, best and front over all."""
    rows = []
    for (dp, ep), result in results:
        for row in result.configs:
            if ep and row["tp"] * dp == 1:
                continue            # one GPU holds every expert either way: the row without EP says it
            row = {**row, "dp": dp, "enable_expert_parallel": ep, "pareto": False}     # priced at tp x dp GPUs
            rows.append(row)
    for row in pareto_front(rows):
        row["pareto"] = True
    first = results[0][1]
    best = choose_best(rows, first.grid.target_rate)
    return LayoutSearchResult(first.grid, rows, best, first.prices, first.executor,
                              sum(r.wall_time for _, r in results), list(first.notes),
                              layouts=tuple(layout for layout, _ in results))


def search_layouts(run_one, spec, layouts: list[Layout]) -> SearchResult:
    """`run_one(spec)` (a SearchResult) for the spec of each layout, merged; one layout without data parallelism
    as it is."""
    if layouts == [(1, False)] or layouts == [(1, True)]:
        (dp, ep), = layouts
        return run_one(replace(spec, deployment=spec.deployment.replace(dp=dp, enable_expert_parallel=ep)))
    results = []
    for dp, ep in layouts:
        laid = replace(spec, deployment=spec.deployment.replace(dp=dp, enable_expert_parallel=ep))
        results.append(((dp, ep), run_one(laid)))
    return merge(results)
