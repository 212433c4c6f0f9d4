"""Many simulations at once: result documents of several specs, in parallel processes."""
from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from typing import Callable

from planner.runs.spec import RunSpec, analysed_document

def run_document(spec: RunSpec) -> dict:
    """Run one spec and return its analysed result document (what a worker process sends back)."""
    return analysed_document(spec, spec.run())


def run_sweep(specs: list[RunSpec], workers: int | None = None,
              on_done: Callable[[RunSpec, dict], None] | None = None) -> list[dict]:
    """Result documents of all specs, in the given order, simulated in parallel processes."""
    for spec in specs:
        spec.check()
    workers = max(1, min(workers or os.cpu_count() or 1, len(specs)))
    if workers == 1:
        docs = []
        for spec in specs:
            docs.append(run_document(spec))
            if on_done is not None:
                on_done(spec, docs[-1])
        return docs
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(run_document, spec) for spec in specs]
        docs = []
        for spec, future in zip(specs, futures):
            docs.append(future.result())
            if on_done is not None:
                on_done(spec, docs[-1])
        return docs
