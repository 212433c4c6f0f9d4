"""A simulation too large for this machine's memory stops with a one-line error instead of being killed.

A run keeps every request it simulates (its tokens until it ends, its record after) and every replica's
block tables, so its memory grows with the requests and replicas it is given: ShareGPT at 16 req/s on one
H100 running Llama-3.1-8B holds 15-20 KiB a request (350 MiB for 10 minutes), and a replica of that
deployment about 4 MiB before any request (measured 2026-12-04). A run too large for the machine (a day
of heavy traffic, thousands of replicas) would grow until the kernel's out-of-memory killer ended it,
minutes later and with nothing said. Instead:

- `check_trace_size` and `check_requests` refuse, before a trace is made, a request count that cannot fit
  at all (each request takes at least MIN_REQUEST_BYTES, its trace entry and its record), and
  `check_replicas` a fleet, or one deployment (a mistyped --num-gpu-blocks), whose block tables alone cannot;
- `check` (called by the simulator every CHECK_EVERY requests it makes and at every engine it builds) stops
  the run once the machine's available memory falls below what the process has grown by since its first
  check: turning the run into results takes about as much again (the records are built from the requests
  while they are still held: +76% of the held memory at the peak, measured on that run), so a run stopped
  later could not finish anyway.

Linux only (/proc); elsewhere nothing is checked.
"""
from __future__ import annotations

import math
import os
from typing import Callable

from engine.host_memory import available_bytes
from planner.errors import PlannerError

MIN_REQUEST_BYTES = 4 << 10   # a ShareGPT request's trace entry (1.4 KiB) and its smallest record, rounded up
MIN_BLOCK_BYTES = 128         # a simulated KV block's bookkeeping (free queue, counts, hash): 160 B measured
MIN_FREE_BYTES = 256 << 20    # never run the machine below this, whatever the run holds
CHECK_EVERY = 512             # requests made between two checks (a check reads /proc: ~20 us)
_MIB = 1 << 20


class OutOfMemory(PlannerError):
    """The run would outgrow this machine's memory."""


def resident_bytes() -> int | None:
    """This process's resident memory, or None where the system does not say."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return None


def check_requests(count: float, source: str | None = None) -> None:
    """Refuse `count` requests (where they come from: `source`, e.g. "--duration 1e9 s at 2 req/s") when even
    their smallest footprint exceeds the memory available now."""
    available = available_bytes()
    if available is None or count * MIN_REQUEST_BYTES <= available:
        return
    what = f"{count:,.0f} requests are" if source is None else f"{source} is about {count:,.0f} requests,"
    raise OutOfMemory(f"{what} more than this machine's memory can simulate "
                      f"(at least {MIN_REQUEST_BYTES >> 10} KiB each: {count * MIN_REQUEST_BYTES / (1 << 30):,.0f} "
                      f"GiB against {available / (1 << 30):.1f} GiB available); give fewer --requests or a "
                      "shorter --duration")


def check_trace_size(requests: int | None, duration: float | None, rate: float) -> None:
    """`check_requests` for a generated trace of at most `requests`, arriving for `duration` s at `rate`."""
    arrivals = math.inf if duration is None else rate * duration
    if requests is not None and requests <= arrivals:
        check_requests(requests)
    elif math.isfinite(arrivals):
        check_requests(arrivals, f"--duration {duration:g} s at {rate:g} req/s")
    elif duration is not None and math.isfinite(duration) and math.isfinite(rate):   # the product overflowed
        raise OutOfMemory(f"--duration {duration:g} s at {rate:g} req/s is more requests than any machine can "
                          f"simulate; give a shorter --duration or --requests")


def check_replicas(replicas: int, blocks_each: int, fix: str = "fewer --replicas") -> None:
    """Refuse a fleet (or one deployment) whose block tables, GPU and CPU, alone exceed the memory available
    now: a mistyped --num-gpu-blocks, --swap-space or --kv-offloading-size as much as too many --replicas (`fix`
    says what to give)."""
    available = available_bytes()
    need = replicas * blocks_each * MIN_BLOCK_BYTES
    if available is None or need <= available:
        return
    what, fix = ((f"{replicas:,} replicas of {blocks_each:,} KV blocks each are", fix)
                 if replicas > 1 else (f"a KV cache of {blocks_each:,} blocks (GPU, CPU swap and offloading) is",
                                       "a smaller --num-gpu-blocks, --num-cpu-blocks, --swap-space or "
                                       "--kv-offloading-size"))
    raise OutOfMemory(f"{what} more than this machine's memory can simulate (at least {MIN_BLOCK_BYTES} bytes a "
                      f"block: {need / (1 << 30):,.0f} GiB against {available / (1 << 30):.1f} GiB available); "
                      f"give {fix}")


class MemoryGuard:
    """Stops a run that has grown past what the machine has left (see the module docstring)."""

    def __init__(self) -> None:
        self.baseline: int | None = None    # resident bytes at the first check

    def check(self, where: Callable[[], str]) -> None:
        """Raise OutOfMemory, saying `where()` the run stopped, when the machine's available memory is below
        MIN_FREE_BYTES or below what this process has grown by since its first check."""
        resident, available = resident_bytes(), available_bytes()
        if resident is None or available is None:
            return
        if self.baseline is None:
            self.baseline = resident
        grown = resident - self.baseline
        if available >= max(MIN_FREE_BYTES, grown):
            return
        raise OutOfMemory(f"the simulation stopped {where()}: it holds {grown // _MIB:,} MiB and this machine has "
                          f"{available // _MIB:,} MiB left, less than building its results needs; simulate fewer "
                          "requests (--requests, --duration) or replicas")


GUARD = MemoryGuard()     # one per process: the machine's memory is shared by everything the process runs
