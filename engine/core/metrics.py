"""The DESIGN.md metric set, computed the same way for live and simulated runs.

Both modes produce the same two record types, one per request and one per
engine step, and ``compute_metrics`` turns them into the metric dictionary.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from engine.core.kv_allocator import MemoryBreakdown
from engine.core.scheduler import SchedulerOutput
from engine.core.sequence import FinishReason, SequenceGroup


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    arrival: float
    prompt_len: int
    output_len: int                     # generated tokens over the returned sequences
    first_scheduled: float | None = None
    first_token: float | None = None
    finish: float | None = None
    token_times: list[float] = field(default_factory=list)
    num_preemptions: int = 0
    rejected: bool = False
    reject_reason: str | None = None

    @classmethod
    def from_group(cls, group: SequenceGroup) -> "RequestRecord":
        t = group.times
        rejected = group.finish_reason is FinishReason.REJECTED
        return cls(group.request_id, t.arrival, group.prompt_len,
                   0 if rejected else group.num_output_tokens(), t.first_scheduled, t.first_token,
                   t.finish, list(t.token_times), group.num_preemptions, rejected, group.reject_reason)

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def e2e(self) -> float:
        return self.finish - self.arrival

    @property
    def tpot(self) -> float | None:
        steps = len(self.token_times)
        return (self.finish - self.first_token) / (steps - 1) if steps > 1 else None

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("token_times")
        return d


@dataclass(slots=True)
class StepRecord:
    start: float
    end: float
    is_prefill: bool
    batch_size: int            # requests in the step
    num_seqs: int
    prefill_tokens: int
    decode_tokens: int
    kv_blocks_used: int
    token_states: int          # KV slots holding real tokens
    reserved: int
    internal_fragmentation: int
    external_fragmentation: int
    free: int
    preempted: int
    swapped_blocks: int

    @property
    def duration(self) -> float:
        return self.end - self.start

    @classmethod
    def from_output(cls, out: SchedulerOutput, start: float, end: float,
                    breakdown: MemoryBreakdown, blocks_used: int) -> "StepRecord":
        tokens = out.num_batched_tokens
        return cls(start, end, out.is_prefill, len(out.groups), len(out.seqs),
                   tokens if out.is_prefill else 0, 0 if out.is_prefill else tokens, blocks_used,
                   breakdown.token_states, breakdown.reserved, breakdown.internal_fragmentation,
                   breakdown.external_fragmentation, breakdown.free, len(out.preempted),
                   len(out.blocks_to_swap_in) + len(out.blocks_to_swap_out))


def _percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), without importing numpy."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _median_p99(values: list[float]) -> tuple[float, float]:
    """_percentile(values, 50) and (values, 99), selecting the few order statistics
    they need instead of sorting twice: an hour's ITLs are millions of values."""
    n = len(values)
    if n < 100_000:
        xs = sorted(values)
        return _percentile(xs, 50), _percentile(xs, 99)
    import numpy as np   # only for large lists: the core imports fast without it
    positions = [(n - 1) * q / 100.0 for q in (50, 99)]
    ranks = sorted({min(int(p) + d, n - 1) for p in positions for d in (0, 1)})
    picked = np.partition(np.array(values, dtype=np.float64), ranks)
    order = {r: float(picked[r]) for r in ranks}   # exactly the sorted list's values at these ranks
    out = []
    for pos in positions:
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        out.append(order[lo] + (order[hi] - order[lo]) * (pos - lo))
    return out[0], out[1]


def _summary(name: str, values: list[float]) -> dict[str, float]:
    n = len(values)
    median, p99 = _median_p99(values) if n else (float("nan"), float("nan"))
    return {f"{name}_mean": sum(values) / n if n else float("nan"),
            f"{name}_median": median,
            f"{name}_p99": p99}


def compute_metrics(requests: list[RequestRecord], steps: list[StepRecord],
                    preemptions: dict[str, int] | None = None) -> dict:
    """Every DESIGN.md metric from per-request and per-step records."""
    done = [r for r in requests if not r.rejected and r.finish is not None]
    rejected = [r for r in requests if r.rejected]
    metrics: dict = {"num_submitted": len(requests), "num_completed": len(done),
                     "num_rejected": len(rejected)}
    if done:
        span = max(r.finish for r in done) - min(r.arrival for r in requests)
        out_tokens = sum(r.output_len for r in done)
        prompt_tokens = sum(r.prompt_len for r in done)
        metrics["duration"] = span
        metrics["request_throughput"] = len(done) / span if span > 0 else float("inf")
        metrics["output_token_throughput"] = out_tokens / span if span > 0 else float("inf")
        metrics["total_token_throughput"] = (out_tokens + prompt_tokens) / span if span > 0 else float("inf")
        metrics.update(_summary("ttft", [r.ttft for r in done]))
        metrics.update(_summary("tpot", [t for r in done if (t := r.tpot) is not None]))
        itl = [b - a for r in done for a, b in zip(r.token_times, r.token_times[1:])]
        metrics.update(_summary("itl", itl))
        metrics.update(_summary("e2e", [r.e2e for r in done]))
        metrics["normalized_latency"] = sum(r.e2e / max(r.output_len, 1) for r in done) / len(done)
    if steps:
        busy = sum(s.duration for s in steps)
        metrics["num_steps"] = len(steps)
        metrics["mean_batch_size"] = sum(s.batch_size for s in steps) / len(steps)
        total_slots = (steps[0].token_states + steps[0].reserved + steps[0].internal_fragmentation
                       + steps[0].external_fragmentation + steps[0].free)
        parts = ("token_states", "reserved", "internal_fragmentation", "external_fragmentation", "free")
        if busy > 0 and total_slots > 0:
            breakdown = {p: sum(getattr(s, p) * s.duration for s in steps) / (busy * total_slots)
                         for p in parts}
        else:
            breakdown = {p: sum(getattr(s, p) for s in steps) / (len(steps) * total_slots) for p in parts}
        metrics["kv_utilization"] = breakdown["token_states"]
        metrics["memory_breakdown"] = breakdown
        metrics["step_time_mean"] = busy / len(steps)
        metrics["step_time_median"] = _percentile([s.duration for s in steps], 50)
    metrics["preemptions"] = dict(preemptions or {"recompute": 0, "swap": 0})
    metrics["preemptions"]["total"] = sum(v for k, v in metrics["preemptions"].items() if k != "total")
    return metrics
