"""The metric set of docs/architecture.md, computed the same way for live and simulated runs.

Both modes produce the same two record types, one per request and one per
engine step, and ``summarize`` (the only place a metric is defined) turns
them into a typed ``Metrics``. ``compute_metrics`` returns its JSON form
(``Metrics.to_dict()``), a dict with the names result files have always used.

Per-request latencies count tokens of ONE sequence: a request sampling n
sequences in parallel emits n tokens per step, but its user waits for each
sequence's tokens one step at a time, so TPOT, ITL and normalized latency
divide by the length of a sequence (the longest returned one, the one the
request's end-to-end latency waits for), never by the n sequences' sum.
Throughput counts every generated token.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from itertools import accumulate, chain
from operator import attrgetter, mul, sub

from engine.core.kv_allocator import MemoryBreakdown
from engine.core.scheduler import SchedulerOutput
from engine.core.sequence import FinishReason, SequenceGroup


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    arrival: float
    prompt_len: int
    output_len: int                     # generated tokens over the returned sequences (throughput)
    first_scheduled: float | None = None
    first_token: float | None = None
    finish: float | None = None
    token_times: list[float] = field(default_factory=list)   # one per step that produced tokens
    num_preemptions: int = 0
    rejected: bool = False
    reject_reason: str | None = None
    seq_output_len: int = 0             # tokens of one sequence: the longest returned one
    num_seqs: int = 1                   # sequences returned (n)
    # Ended before max_tokens without a stop: its output was clipped at the
    # context limit, or the request outgrew the whole KV cache.
    truncated: bool = False
    priority: int = 0                   # vLLM's request priority (read under --scheduling-policy priority)

    @classmethod
    def from_group(cls, group: SequenceGroup, stream_interval: int = 1) -> "RequestRecord":
        """The group's record; with `stream_interval` N > 1 its token times are those a streaming client
        sees them at (`streamed_times`)."""
        t = group.times
        rejected = group.finish_reason is FinishReason.REJECTED
        lengths = [] if rejected else [len(tokens) for tokens, *_ in group.outputs()]
        longest = max(lengths, default=0)
        truncated = group.finish_reason is FinishReason.LENGTH and longest < group.params.max_tokens
        return cls(group.request_id, t.arrival, group.prompt_len,
                   0 if rejected else group.num_output_tokens(), t.first_scheduled, t.first_token,
                   t.finish, streamed_times(t.token_times, stream_interval, t.token_counts),
                   group.num_preemptions, rejected, group.reject_reason, longest, max(len(lengths), 1), truncated,
                   group.priority)

    @property
    def completed(self) -> bool:
        """Served in full: neither rejected nor truncated, and finished."""
        return not self.rejected and not self.truncated and self.finish is not None

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def e2e(self) -> float:
        return self.finish - self.arrival

    @property
    def tpot(self) -> float | None:
        """(finish - first token) / (tokens of one sequence - 1): the mean gap of this request."""
        tokens = self.seq_output_len or len(self.token_times)
        return (self.finish - self.first_token) / (tokens - 1) if tokens > 1 else None

    @property
    def normalized_latency(self) -> float:
        """E2E / tokens of one sequence (s/token), the PagedAttention paper's per-request figure."""
        return self.e2e / max(self.seq_output_len or self.output_len, 1)

    @property
    def itl(self) -> list[float]:
        """Gaps between consecutive token times of this request (one sequence's tokens)."""
        times = self.token_times
        return [b - a for a, b in zip(times, times[1:])]

    def itl_stats(self) -> tuple[float | None, float | None, float | None]:
        """(itl_mean, itl_p50, itl_p99), the gaps taken and sorted once (requests.csv)."""
        gaps = self.itl
        if not gaps:
            return None, None, None
        ordered = sorted(gaps)           # percentile's own sort of a sorted list is one pass
        return sum(gaps) / len(gaps), percentile(ordered, 50), percentile(ordered, 99)

    @property
    def itl_mean(self) -> float | None:
        return self.itl_stats()[0]

    @property
    def itl_p50(self) -> float | None:
        return self.itl_stats()[1]

    @property
    def itl_p99(self) -> float | None:
        return self.itl_stats()[2]

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("token_times")
        return d


def streamed_times(token_times: list[float], interval: int, counts: list[int] | None = None) -> list[float]:
    """The times a streaming client gets an answer's tokens at when the server sends them `interval` at a
    time (vLLM's --stream-interval, vllm/v1/engine/output_processor.py RequestState.make_request_output):
    the first step's at once, then each time `interval` more have come since the last sent, and the rest
    when the answer ends. `counts`: the tokens each step gave (speculative steps give several; None: one
    each)."""
    if interval <= 1 or len(token_times) <= 1:
        return list(token_times)
    if counts is None:
        sent = token_times[::interval]
        if (len(token_times) - 1) % interval:
            sent.append(token_times[-1])
        return sent
    sent, unsent = [token_times[0]], 0
    for t, count in zip(token_times[1:], counts[1:]):
        unsent += count
        if unsent >= interval:
            sent.append(t)
            unsent = 0
    if unsent:
        sent.append(token_times[-1])
    return sent


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
        if out.token_split is not None:      # a chunked-prefill step may mix both
            prefill, decode = out.token_split
        elif out.is_prefill:
            prefill, decode = out.num_batched_tokens, 0
        else:
            prefill, decode = 0, out.num_batched_tokens
        return cls(start, end, out.is_prefill, len(out.groups), len(out.seqs), prefill, decode, blocks_used,
                   breakdown.token_states, breakdown.reserved, breakdown.internal_fragmentation,
                   breakdown.external_fragmentation, breakdown.free, len(out.preempted),
                   len(out.blocks_to_swap_in) + len(out.blocks_to_swap_out))


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), without importing numpy."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


LATENCY_STATISTICS = ("mean", "median", "p90", "p95", "p99")


def latency_summary(name: str, values: list[float]) -> dict[str, float | None]:
    """``{name_mean, name_median, name_p90, name_p95, name_p99}`` of values (None when empty), for callers
    that add a metric of their own under the same naming."""
    return {f"{name}_{statistic}": value for statistic, value in zip(LATENCY_STATISTICS, _latency_stats(values))}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


LARGE = 100_000   # values from which numpy beats lists (and is worth its import)


def _median_p99(values) -> tuple[float, float]:
    """percentile(values, 50) and (values, 99)."""
    median, p99 = _percentiles(values, (50, 99))
    return median, p99


def _percentiles(values, qs: tuple[float, ...]) -> list[float]:
    """percentile(values, q) for each q, selecting the few order statistics they need
    instead of sorting (an hour's ITLs, a fleet's steps: millions of values)."""
    n = len(values)
    if n < LARGE:
        xs = sorted(values)
        return [percentile(xs, q) for q in qs]
    import numpy as np   # only for large lists: the core imports fast without it
    positions = [(n - 1) * q / 100.0 for q in qs]
    ranks = sorted({min(int(p) + d, n - 1) for p in positions for d in (0, 1)})
    picked = np.partition(np.asarray(values, dtype=np.float64), ranks)
    order = {r: float(picked[r]) for r in ranks}   # exactly the sorted list's values at these ranks
    out = []
    for pos in positions:
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        out.append(order[lo] + (order[hi] - order[lo]) * (pos - lo))
    return out


def _stats(values) -> tuple[float | None, float | None, float | None]:
    """(mean, median, p99) of a list (or, when large, a numpy array), or Nones when it is empty."""
    if not len(values):
        return None, None, None
    median, p99 = _median_p99(values)
    mean = _mean(values) if isinstance(values, list) else float(values.sum()) / len(values)
    return mean, median, p99


def _latency_stats(values) -> tuple[float | None, ...]:
    """(mean, median, p90, p95, p99) of a list (or, when large, a numpy array), or Nones when it is empty."""
    if not len(values):
        return (None,) * len(LATENCY_STATISTICS)
    mean = _mean(values) if isinstance(values, list) else float(values.sum()) / len(values)
    return (mean, *_percentiles(values, (50, 90, 95, 99)))


def _gaps(done: list[RequestRecord]) -> tuple[list[float], list[float]]:
    """Every gap of every request, pooled, and each request's own p99 gap."""
    pooled: list[float] = []
    worst: list[float] = []
    if sum(len(r.token_times) for r in done) >= LARGE:
        return TokenGaps(done).pick(done)
    for r in done:
        gaps = r.itl
        if gaps:
            pooled += gaps
            worst.append(percentile(gaps, 99))
    return pooled, worst


def peak_per_second(done: list[RequestRecord]) -> tuple[float, int]:
    """vllm bench serve's peaks (vllm/benchmarks/serve.py, calculate_metrics): the run cut into whole seconds
    from the first arrival, the most token times in one second (a time per streamed chunk: one token, or a
    step's accepted drafts together), and the most requests in flight during one second (a request counts
    in every second from the one it arrives in to the one it ends in)."""
    start = min(r.arrival for r in done)
    seconds = int(math.ceil(max(r.finish for r in done) - start)) + 1
    in_flight = [0] * (seconds + 1)
    for r in done:                          # +1 where a request's seconds begin, -1 past their end
        in_flight[int(r.arrival - start)] += 1
        in_flight[int(r.finish - start) + 1] -= 1
    if sum(len(r.token_times) for r in done) >= LARGE:
        import numpy as np
        buckets = (token_time_arrays(done)[1] - start).astype(np.int64)
        tokens = int(np.bincount(buckets).max())
    else:
        tokens = max(Counter(int(t - start) for r in done for t in r.token_times).values(), default=0)
    return float(tokens), max(accumulate(in_flight))


def token_time_arrays(records: list[RequestRecord]):
    """(each record's count of token times, every token time laid end to end), as numpy arrays: millions
    of times read in one pass."""
    import numpy as np
    lengths = np.fromiter((len(r.token_times) for r in records), dtype=np.int64, count=len(records))
    times = np.fromiter(chain.from_iterable(r.token_times for r in records), dtype=np.float64,
                        count=int(lengths.sum()))
    return lengths, times


class TokenGaps:
    """_gaps for millions of token times, on numpy arrays, and for any subset of the requests once
    built (a fleet's summary and each replica's read the same requests: the times are read and each
    request's p99 taken once). The same differences and the same per-request percentile arithmetic
    as the lists; the pooled gaps stay one array. Every time is read into one array and differenced
    once (a few array operations for the run, not a few per request); a subset's gaps are picked
    from it, the differences across two requests left out."""

    def __init__(self, done: list[RequestRecord]) -> None:
        import numpy as np
        self.row = {id(r): i for i, r in enumerate(done)}
        lengths, times = token_time_arrays(done)
        self.gaps = times[1:] - times[:-1]          # np.diff's differences
        self.starts = np.cumsum(lengths) - lengths  # each request's first time, and first gap
        self.counts = np.maximum(lengths - 1, 0)    # its gaps
        # Each request's p99 gap: its gaps sorted, then the percentile's interpolation for all of
        # them at once (numpy's float64 arithmetic is Python's). The requests with the same number of
        # gaps are sorted together, one row each (a few hundred sorts, not one per request).
        ordered = self.gaps.copy()
        has = self.counts > 0
        n = self.counts[has]
        first = self.starts[has]
        for count in np.unique(n).tolist():
            cells = first[n == count][:, None] + np.arange(count)
            ordered[cells] = np.sort(ordered[cells], axis=1)
        pos = (n - 1) * 99 / 100.0
        lo = pos.astype(np.int64)
        hi = np.minimum(lo + 1, n - 1)
        below, above = ordered[first + lo], ordered[first + hi]
        self.worst = np.full(len(done), np.nan)
        self.worst[has] = below + (above - below) * (pos - lo)

    def of(self, done: list[RequestRecord]) -> tuple[list[float], list[float]]:
        """_gaps(done), for requests among those this was built from."""
        if sum(len(r.token_times) for r in done) < LARGE:
            return _gaps(done)
        return self.pick(done)

    def pick(self, done: list[RequestRecord]):
        import numpy as np
        rows = np.fromiter((self.row[id(r)] for r in done), dtype=np.int64, count=len(done))
        counts = self.counts[rows]
        total = int(counts.sum())
        offsets = np.cumsum(counts) - counts        # where each request's gaps go in the pooled array
        pooled = self.gaps[np.repeat(self.starts[rows] - offsets, counts) + np.arange(total)]
        worst = self.worst[rows[counts > 0]].tolist()
        return (pooled if len(pooled) else []), worst


MEMORY_PARTS = ("token_states", "reserved", "internal_fragmentation", "external_fragmentation", "free")


@dataclass
class Metrics:
    """A run's metrics. Field names are the result-file keys; None means "not defined for
    this run" (no completed request, no decode step, ...), written as JSON null.

    Latencies are over completed requests only: rejected and truncated requests
    are counted apart, and ``num_completed + num_rejected + num_truncated ==
    num_submitted``.
    """

    num_submitted: int = 0
    num_completed: int = 0
    num_rejected: int = 0
    num_truncated: int = 0
    duration: float | None = None                  # last completed finish - first arrival
    total_input_tokens: int = 0                    # prompt tokens of the completed requests (vLLM bench's name)
    total_output_tokens: int = 0                   # tokens they generated, all sequences (vLLM bench's name)
    request_throughput: float | None = None        # completed requests / duration
    output_token_throughput: float | None = None   # generated tokens (all sequences) / duration
    total_token_throughput: float | None = None    # (generated + prompt tokens) / duration
    # Each latency's mean, median and the percentiles vLLM bench reports (--metric-percentiles 90,95,99).
    ttft_mean: float | None = None
    ttft_median: float | None = None
    ttft_p90: float | None = None
    ttft_p95: float | None = None
    ttft_p99: float | None = None
    tpot_mean: float | None = None                 # over requests of (finish - first token) / (L - 1)
    tpot_median: float | None = None
    tpot_p90: float | None = None
    tpot_p95: float | None = None
    tpot_p99: float | None = None
    itl_mean: float | None = None                  # pooled: every gap of every completed request
    itl_median: float | None = None
    itl_p50: float | None = None                   # = itl_median, under the name vLLM's benchmarks use
    itl_p90: float | None = None
    itl_p95: float | None = None
    itl_p99: float | None = None
    request_itl_p99_mean: float | None = None      # over requests of each request's own p99 gap
    request_itl_p99_median: float | None = None
    request_itl_p99_p99: float | None = None
    e2e_mean: float | None = None
    e2e_median: float | None = None
    e2e_p90: float | None = None
    e2e_p95: float | None = None
    e2e_p99: float | None = None
    normalized_latency: float | None = None        # mean over requests of E2E / L (s/token)
    mean_concurrency: float | None = None          # requests in flight, time-averaged: sum of E2E / duration
    # vllm bench serve's "Peak output token throughput" and "Peak concurrent requests" (`peak_per_second`)
    max_output_tokens_per_s: float | None = None
    max_concurrent_requests: int | None = None
    num_steps: int = 0
    num_prefill_steps: int = 0
    num_decode_steps: int = 0
    mean_batch_size: float | None = None           # requests per decode step, over decode steps
    mean_prefill_batch_size: float | None = None   # requests per prefill step, over prefill steps
    mean_step_batch_size: float | None = None      # requests per step, over all steps
    kv_utilization: float | None = None            # time-averaged token-state share of KV slots
    memory_breakdown: dict[str, float] | None = None
    step_time_mean: float | None = None
    step_time_median: float | None = None
    preemptions: dict[str, int] = field(default_factory=lambda: {"recompute": 0, "swap": 0, "total": 0})

    def __getitem__(self, name: str):
        """``metrics["ttft_p99"]`` reads the field of that result-file name (as the dict did)."""
        if name not in self.__dataclass_fields__:
            raise KeyError(name)
        return getattr(self, name)

    @property
    def num_failed(self) -> int:
        """Requests not served in full: what an SLO or capacity check must count as misses."""
        return self.num_rejected + self.num_truncated

    def to_dict(self) -> dict:
        """The JSON form: every field under its own name (None where undefined)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["memory_breakdown"] = dict(self.memory_breakdown) if self.memory_breakdown is not None else None
        out["preemptions"] = dict(self.preemptions)
        return out


def failed_requests(doc: dict) -> int:
    """Rejected + truncated requests of a result document (a ``Metrics.to_dict()``)."""
    return int(doc.get("num_rejected") or 0) + int(doc.get("num_truncated") or 0)


def slo_attainment(doc: dict) -> float | None:
    """DistServe's SLO attainment of a result document judged with SLOs: the share of the submitted requests
    served within every SLO's per-request limit (a rejected or truncated request is not); None without SLOs."""
    good, submitted = doc.get("num_good"), doc.get("num_submitted")
    return good / submitted if good is not None and submitted else None


def slo_quantity(name: str) -> str:
    """The per-request quantity an SLO on an aggregate bounds in each request (ttft_p99 -> ttft)."""
    return "normalized_latency" if name == "normalized_latency" else name.split("_")[0]


def request_quantity(record: RequestRecord, quantity: str) -> float:
    """One served request's ttft, tpot, e2e, itl (its longest gap) or normalized_latency. A request of one
    token has no TPOT; vLLM's benchmark counts it as 0 when it judges goodput, and so does this."""
    if quantity == "ttft":
        return record.ttft
    if quantity == "tpot":
        return record.tpot or 0.0
    if quantity == "e2e":
        return record.e2e
    if quantity == "itl":
        return max(record.itl, default=0.0)
    return record.normalized_latency


def goodput(served: list, slos: dict[str, float], span: float | None,
            quantity: Callable[[object, str], float] = request_quantity) -> dict:
    """`vllm bench serve --goodput`'s figure (DistServe's): the served requests whose every per-request
    quantity is within its SLO's limit (`slo_quantity`), per second of `span` (the run's duration);
    `quantity(request, name)` reads one (default: a RequestRecord's)."""
    good = sum(all(quantity(r, slo_quantity(name)) <= limit for name, limit in slos.items()) for r in served)
    return {"num_good": good, "request_goodput": good / span if span else 0.0}


def compute_metrics(requests: list[RequestRecord], steps: list[StepRecord],
                    preemptions: dict[str, int] | None = None) -> dict:
    """The metrics as the result-file dictionary: ``summarize(...).to_dict()``."""
    return summarize(requests, steps, preemptions).to_dict()


def summarize(requests: list[RequestRecord], steps: list[StepRecord],
              preemptions: dict[str, int] | None = None, columns: dict | None = None,
              gaps: TokenGaps | None = None) -> Metrics:
    """Every metric of docs/architecture.md from per-request and per-step records (the one
    place they are computed, for live runs, the simulator and recorded runs alike).
    `columns`: the steps' `step_columns`, and `gaps` a `TokenGaps` of the requests (or of more),
    when the caller has them (the same numbers, read once for a fleet and each of its replicas)."""
    done = [r for r in requests if r.completed]
    m = Metrics(num_submitted=len(requests), num_completed=len(done),
                num_rejected=sum(r.rejected for r in requests),
                num_truncated=sum(r.truncated and not r.rejected for r in requests))
    if done:
        # to the last end, a refused request's too (vLLM's benchmark times its whole run, failures included)
        span = max(r.finish for r in requests if r.finish is not None and (r.completed or r.rejected)) \
            - min(r.arrival for r in requests)
        out_tokens = sum(r.output_len for r in done)
        prompt_tokens = sum(r.prompt_len for r in done)
        m.duration = span
        m.total_input_tokens, m.total_output_tokens = prompt_tokens, out_tokens
        m.request_throughput = len(done) / span if span > 0 else float("inf")
        m.output_token_throughput = out_tokens / span if span > 0 else float("inf")
        m.total_token_throughput = (out_tokens + prompt_tokens) / span if span > 0 else float("inf")
        m.ttft_mean, m.ttft_median, m.ttft_p90, m.ttft_p95, m.ttft_p99 = _latency_stats([r.ttft for r in done])
        m.tpot_mean, m.tpot_median, m.tpot_p90, m.tpot_p95, m.tpot_p99 = _latency_stats(
            [t for r in done if (t := r.tpot) is not None])
        pooled, worst = _gaps(done) if gaps is None else gaps.of(done)   # every gap; each request's p99 gap
        m.itl_mean, m.itl_median, m.itl_p90, m.itl_p95, m.itl_p99 = _latency_stats(pooled)
        m.itl_p50 = m.itl_median
        m.request_itl_p99_mean, m.request_itl_p99_median, m.request_itl_p99_p99 = _stats(worst)
        m.e2e_mean, m.e2e_median, m.e2e_p90, m.e2e_p95, m.e2e_p99 = _latency_stats([r.e2e for r in done])
        m.normalized_latency = _mean([r.normalized_latency for r in done])
        m.mean_concurrency = sum(r.e2e for r in done) / span if span > 0 else None
        m.max_output_tokens_per_s, m.max_concurrent_requests = peak_per_second(done)
    if steps:
        if columns is None:
            _step_metrics(m, steps)
        else:
            _column_metrics(m, columns)
    counts = dict(preemptions or {"recompute": 0, "swap": 0})
    counts["total"] = sum(v for k, v in counts.items() if k != "total")
    m.preemptions = counts
    return m


def _step_metrics(m: Metrics, steps: list[StepRecord]) -> None:
    """The step counts, batch sizes, memory breakdown and step times (each sum taken in step order,
    the attribute reads done by `operator`: a long run has hundreds of thousands of steps)."""
    # A decode step decodes at least one token (a chunked-prefill step that
    # mixes prompt chunks with decodes counts as one); a prefill step only
    # computes prompts; a step that only moves blocks (a swap) is neither.
    decode = [s.batch_size for s in steps if s.decode_tokens > 0]
    prefill = [s.batch_size for s in steps if s.prefill_tokens > 0 and s.decode_tokens == 0]
    m.num_steps, m.num_prefill_steps, m.num_decode_steps = len(steps), len(prefill), len(decode)
    m.mean_batch_size = _mean(decode)
    m.mean_prefill_batch_size = _mean(prefill)
    m.mean_step_batch_size = _mean(list(map(attrgetter("batch_size"), steps)))
    durations = list(map(sub, map(attrgetter("end"), steps), map(attrgetter("start"), steps)))
    m.memory_breakdown = _memory_breakdown(steps, durations)
    m.kv_utilization = m.memory_breakdown["token_states"]
    busy = sum(durations)
    m.step_time_mean = busy / len(steps)
    m.step_time_median = _percentiles(durations, (50,))[0]


STEP_COLUMNS = ("start", "end", "batch_size", "prefill_tokens", "decode_tokens", *MEMORY_PARTS)


def step_columns(steps: list[StepRecord]) -> dict:
    """The step fields the metrics read, one numpy array each (a pass per field), for summarizing the
    same steps more than once: a fleet's replicas, then the fleet in merged order (`pick_columns`)."""
    import numpy as np   # only for callers that summarize many steps
    return {name: np.fromiter(map(attrgetter(name), steps), dtype=np.float64 if name in ("start", "end") else np.int64,
                              count=len(steps)) for name in STEP_COLUMNS}


def pick_columns(parts: list[dict], order) -> dict:
    """Several runs' step columns laid end to end, then taken in `order` (positions)."""
    import numpy as np
    return {name: np.concatenate([part[name] for part in parts])[order] for name in STEP_COLUMNS}


def _column_metrics(m: Metrics, c: dict) -> None:
    """_step_metrics from step_columns: the same numbers (integer sums exact, float sums taken by
    Python's sum in step order over the same products and differences)."""
    size, decodes, prefills = c["batch_size"], c["decode_tokens"] > 0, c["prefill_tokens"] > 0
    decode, prefill = size[decodes], size[prefills & ~decodes]
    m.num_steps, m.num_prefill_steps, m.num_decode_steps = len(size), len(prefill), len(decode)
    m.mean_batch_size = int(decode.sum()) / len(decode) if len(decode) else None
    m.mean_prefill_batch_size = int(prefill.sum()) / len(prefill) if len(prefill) else None
    m.mean_step_batch_size = int(size.sum()) / len(size)
    spans = c["end"] - c["start"]
    busy = _running_sum(spans)
    total_slots = sum(int(c[p][0]) for p in MEMORY_PARTS)
    if total_slots <= 0:
        m.memory_breakdown = {p: 0.0 for p in MEMORY_PARTS}
    elif busy > 0:
        m.memory_breakdown = {p: _running_sum(c[p] * spans) / (busy * total_slots) for p in MEMORY_PARTS}
    else:
        m.memory_breakdown = {p: int(c[p].sum()) / (len(size) * total_slots) for p in MEMORY_PARTS}
    m.kv_utilization = m.memory_breakdown["token_states"]
    m.step_time_mean = busy / len(size)
    m.step_time_median = _percentiles(spans if len(spans) >= LARGE else spans.tolist(), (50,))[0]


def _running_sum(values) -> float:
    """sum(values.tolist()) of a float numpy array, without the list: numpy's cumsum adds one value at
    a time from the first, as Python's sum of floats does (np.sum adds pairwise: other floats)."""
    return float(values.cumsum()[-1]) if len(values) else 0.0


def _memory_breakdown(steps: list[StepRecord], durations: list[float]) -> dict[str, float]:
    """Share of KV slots per use, weighted by step duration (plain mean if no time passed)."""
    first = steps[0]
    total_slots = sum(getattr(first, p) for p in MEMORY_PARTS)
    if total_slots <= 0:
        return {p: 0.0 for p in MEMORY_PARTS}
    busy = sum(durations)
    if busy > 0:
        return {p: sum(map(mul, map(attrgetter(p), steps), durations)) / (busy * total_slots)
                for p in MEMORY_PARTS}
    return {p: sum(map(attrgetter(p), steps)) / (len(steps) * total_slots) for p in MEMORY_PARTS}
