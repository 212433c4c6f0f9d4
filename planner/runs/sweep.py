"""Many simulations at once: result documents of several runs, in parallel processes.

Each spec is prepared (deployment planned, cost model built) once, here, so a
bad one fails before any process starts; the prepared simulation travels to
the worker, which runs it and sends back the result document.
"""
from __future__ import annotations

from typing import Callable

from planner.runs.pipeline import Simulation
from planner.runs.pools import LocalExecutor
from planner.runs.spec import Load, RunSpec


def document_of(simulation: Simulation, load: Load | None = None) -> dict:
    """The result document of one run of `simulation` (what a worker sends back)."""
    return simulation.run(load).document()


def _document_of_job(job: tuple[Simulation, Load | None]) -> dict:
    return document_of(*job)


def run_many(jobs: list[tuple[Simulation, Load | None]], workers: int | None = None,
             on_done: Callable[[int, dict], None] | None = None) -> list[dict]:
    """Result documents of every (simulation, load) job, in order; `on_done(i, doc)` as each one ends."""
    return LocalExecutor(workers).map(_document_of_job, jobs, on_done)


def run_sweep(specs: list[RunSpec], workers: int | None = None,
              on_done: Callable[[RunSpec, dict], None] | None = None) -> list[dict]:
    """Result documents of all specs, in the given order, simulated in parallel processes."""
    simulations = [Simulation.prepare(spec) for spec in specs]
    report = None if on_done is None else (lambda i, doc: on_done(specs[i], doc))
    return run_many([(s, None) for s in simulations], workers, report)
