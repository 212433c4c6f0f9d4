"""The host's memory: what the kernel could still give (`available_bytes`), and glibc's malloc kept from
handing big buffers back to the OS between steps.

A CPU forward pass allocates activation and logits buffers of a few MB. By
default glibc serves those with mmap and trims the heap when they are freed,
so every step page-faults its buffers in again: on opt-125m that made decode
steps about 17% slower, and by an amount that varied with what ran before
(glibc moves its thresholds as it sees larger frees), which the cost model
cannot predict. Fixed, generous thresholds make step times both shorter and
reproducible. Only glibc is tuned; elsewhere this does nothing.

`available_bytes` is read before a KV cache is allocated here and by the simulator's memory guard
(planner/sim/memory_guard.py), so neither outgrows the machine.
"""
from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 256 << 20   # serve anything below this from the heap
TRIM_THRESHOLD = 1 << 30     # give heap memory back only past this much free at the top

_done = False


def keep_host_buffers() -> bool:
    """Set the thresholds once per process; True when glibc accepted them."""
    global _done
    if _done:
        return True
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and \
            libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    except (OSError, AttributeError):   # not glibc: no mallopt
        return False
    _done = ok
    return ok


# A container's memory limit: (limit, usage, stats, the stat of page cache the kernel can reclaim) for
# cgroup v2 and v1. /proc/meminfo shows the host's memory, while the container is killed at its limit.
CGROUPS = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.stat",
            "inactive_file"),
           ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes",
            "/sys/fs/cgroup/memory/memory.stat", "total_inactive_file"))


def available_bytes() -> int | None:
    """The memory the kernel could give without swapping (MemAvailable), less where a container's limit
    leaves less; None where the system does not say."""
    available = _read_stat("/proc/meminfo", "MemAvailable:")
    available = None if available is None else available * 1024
    for limit_path, usage_path, stat_path, reclaimable in CGROUPS:
        limit, usage = _read_int(limit_path), _read_int(usage_path)
        if limit is None or usage is None or limit >= 1 << 60:     # no such cgroup, or no limit
            continue
        headroom = limit - usage + (_read_stat(stat_path, reclaimable + " ") or 0)
        available = headroom if available is None else min(available, headroom)
        break
    return available


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read())
    except (OSError, ValueError):      # absent, or "max" (no limit)
        return None


def _read_stat(path: str, key: str) -> int | None:
    """The number after `key` on its line of `path` (a "key value" listing)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except (OSError, IndexError, ValueError):
        pass
    return None
