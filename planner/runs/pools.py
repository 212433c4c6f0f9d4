"""Where many simulations run: a local process pool (default) or Ray tasks (sweeps, seeds, searches).

Both run the same picklable function on the same inputs and hand results back
in submission order, so they give identical results. Ray is an optional extra
(`pip install paged-planner[ray]`); `address="auto"` joins a running cluster,
None starts a local one.
"""
from __future__ import annotations

import os
from pathlib import Path
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Callable, Iterable

from planner.errors import PlannerError

EXECUTORS = ("local", "ray")
Done = Callable[[int, Any], None]        # (index of the input, its result) as each one finishes


class LocalExecutor:
    """A process pool over this machine's cores; `workers=1` runs in this process."""

    name = "local"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = max(1, workers or os.cpu_count() or 1)

    def map(self, fn: Callable, items: Iterable, on_done: Done | None = None) -> list:
        items = list(items)
        results: list = [None] * len(items)
        if self.workers == 1 or len(items) <= 1:
            for i, item in enumerate(items):
                results[i] = fn(item)
                if on_done is not None:
                    on_done(i, results[i])
            return results
        with ProcessPoolExecutor(max_workers=min(self.workers, len(items))) as pool:
            futures = {pool.submit(fn, item): i for i, item in enumerate(items)}
            for future in as_completed(futures):
                i = futures[future]
                results[i] = future.result()
                if on_done is not None:
                    on_done(i, results[i])
        return results


class RayExecutor:
    """Each item is one Ray task; results come back as they finish."""

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise PlannerError("--executor ray needs Ray: pip install 'paged-planner[ray]'") from None
        self.ray = ray
        self.started = False
        if not ray.is_initialized():
            kwargs: dict = {"address": address, "log_to_driver": False, "include_dashboard": False}
            if address is None:
                kwargs["num_cpus"] = num_cpus
                # Workers import this package from the same checkout as the driver.
                kwargs["runtime_env"] = {"env_vars": {"PYTHONPATH": _package_root()}}
            try:
                ray.init(**{k: v for k, v in kwargs.items() if v is not None or k == "address"})
            except ConnectionError as exc:
                raise PlannerError(f"--ray-address {address}: cannot join a Ray cluster ({exc})") from None
            self.started = True

    def map(self, fn: Callable, items: Iterable, on_done: Done | None = None) -> list:
        ray = self.ray
        task = ray.remote(fn)
        refs = [task.remote(item) for item in items]
        index = {ref: i for i, ref in enumerate(refs)}
        results: list = [None] * len(refs)
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            i = index[ready[0]]
            try:
                results[i] = ray.get(ready[0])
            except ray.exceptions.RayTaskError as exc:
                # The task's own error (a PlannerError is one line for the user), not Ray's wrapper.
                cause = getattr(exc, "cause", None)
                raise (cause if isinstance(cause, Exception) else PlannerError(str(exc).splitlines()[0])) from None
            if on_done is not None:
                on_done(i, results[i])
        return results

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[2])


def make_executor(name: str, *, workers: int | None = None, ray_address: str | None = None):
    if name == "local":
        if ray_address is not None:
            raise PlannerError("--ray-address needs --executor ray")
        return LocalExecutor(workers)
    check_executor(name)
    return RayExecutor(ray_address, num_cpus=workers)


def check_executor(name: str) -> None:
    if name not in EXECUTORS:
        raise PlannerError(f"unknown executor {name!r}; choose one of {', '.join(EXECUTORS)}")
