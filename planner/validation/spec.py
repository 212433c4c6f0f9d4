"""What a validation runs: a deployment, a trace scaled to the device, and how to price and judge it."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.deployment import Deployment
from planner.errors import PlannerError
from planner.runs.seeds import MAX_SEEDS
from planner.runs.spec import check_ramp_up_rate
from planner.sim.memory_guard import check_trace_size
from workloads import RampUp, Trace, TraceError, burstiness_arrival, make_trace
from workloads.clients import ClientKnobs, TurnQueue, check_clients, conversations_in
from workloads.sessions import TurnsAfterAnswers
from workloads.trace import MAX_LENGTH_SCALE

CPU_KV_CACHE_BYTES = 1 << 30           # the live engine's KV cache on a CPU (the profiler sizes it the same)
DEFAULT_RATE = 4.0                     # requests/s of an open loop when no rate is given


@dataclass(frozen=True)
class ValidationSpec:
    deployment: Deployment = field(default_factory=lambda: Deployment(model="opt-125m", gpu="cpu"))
    workload: str = "sharegpt"         # a built-in workload or a trace file
    params: tuple[tuple[str, object], ...] = ()   # the workload's -p KEY=VALUE, already typed
    rate: float | None = None          # requests/s (Poisson); None: DEFAULT_RATE, or a closed loop's none
    burstiness: float = 1.0            # vLLM bench's: gamma-distributed gaps of this shape (1: Poisson)
    ramp_up: RampUp | None = None      # vLLM bench's ramp-up instead of a rate (workloads/arrivals.py)
    # A closed loop of this many clients: each sends its next request the moment its previous one ends, live
    # and simulated alike (vLLM bench's --max-concurrency at an unlimited rate). With a rate too, at most this
    # many requests in flight, each sent at its arrival time or, with all N out then, when one of them ends
    # (vLLM bench's --request-rate with --max-concurrency).
    concurrency: int | None = None
    requests: int = 64
    seed: int = 0
    length_scale: float = 0.25         # CPU runs: shrink lengths so a run takes minutes
    max_prompt_len: int = 512
    max_output_len: int = 256
    profile: str | None = None         # default: the profile under profiles/<gpu>/ matching the deployment
    # Follow the device's speed during the live run (planner/profile/speed.py). None: the timeline of a profile
    # timed along the run, yes; a canary speed level, no (True applies either, False neither).
    speed_correction: bool | None = None
    attribution: bool = False          # also split the error by source (replays: planner/validation/attribution.py)
    seeds: int = 5                     # simulations with timing noise for the intervals (planner/validation/spread.py)
    kv_cache_memory_bytes: int = CPU_KV_CACHE_BYTES
    recording: str | None = None       # validate --measured: the recorded run whose requests are the trace

    def __post_init__(self) -> None:
        if not isinstance(self.seeds, int) or not 0 <= self.seeds <= MAX_SEEDS:
            raise PlannerError(f"--seeds must be 0 (no intervals) to {MAX_SEEDS:,}, got {self.seeds}")
        if self.concurrency is not None and (not isinstance(self.concurrency, int) or self.concurrency < 1):
            raise PlannerError(f"--concurrency must be at least 1 client, got {self.concurrency}")
        if self.requests < 1:
            raise PlannerError(f"--requests must be at least 1, got {self.requests}")
        if self.rate is not None and not self.rate > 0:      # (inf: every request at once)
            raise PlannerError(f"--rate must be a positive number of requests/s, got {self.rate}")
        check_ramp_up_rate(self.ramp_up, self.rate)
        check_trace_size(self.requests, None, self.arrival_rate)
        self._arrival()
        if not 0 < self.length_scale <= MAX_LENGTH_SCALE:
            raise PlannerError(f"--length-scale must be a positive number up to {MAX_LENGTH_SCALE:g}, "
                               f"got {self.length_scale}")
        for name in ("max_prompt_len", "max_output_len"):
            if getattr(self, name) < 1:
                raise PlannerError(f"--{name.replace('_', '-')} must be at least 1 token, got {getattr(self, name)}")

    @property
    def live_deployment(self) -> Deployment:
        """The deployment the live engine runs: its KV cache `kv_cache_memory_bytes` unless the deployment
        sizes it (--kv-cache-memory-bytes, --num-gpu-blocks)."""
        d = self.deployment
        return d if d.kv_cache_memory_bytes or d.num_gpu_blocks else d.replace(
            kv_cache_memory_bytes=self.kv_cache_memory_bytes)

    @property
    def paced(self) -> bool:
        """A limit on requests in flight over a rate's arrivals (not a closed loop alone)."""
        return self.concurrency is not None and (self.rate is not None or self.ramp_up is not None)

    @property
    def arrival_rate(self) -> float:
        """The trace's request rate: inf for a closed loop alone (its times do not count) or a ramp-up's
        (which times the trace itself)."""
        if self.rate is not None:
            return self.rate
        return math.inf if self.concurrency is not None or self.ramp_up is not None else DEFAULT_RATE

    @property
    def request_rate(self) -> float | None:
        """The rate the documents record: None for a closed loop alone, whose times do not count, for a
        ramp-up, whose rate rises, and for a recorded run, which has its own times."""
        if self.recording is not None or self.ramp_up is not None or self.concurrency is not None and not self.paced:
            return None
        return self.arrival_rate

    @property
    def clients(self) -> dict:
        """How requests reach the simulated engine, as `simulate` takes it: a closed loop, paced or not."""
        return {"concurrency": self.concurrency, "paced": self.paced}

    def _arrival(self) -> dict:
        """make_trace's arrival keywords for the burstiness at the rate, checked in one line."""
        try:
            return burstiness_arrival(self.burstiness, self.ramp_up.start_rps if self.ramp_up else self.arrival_rate)
        except TraceError as exc:
            raise PlannerError(str(exc)) from None

    def turn_queue(self, trace: Trace) -> TurnQueue:
        """What the spec's closed loop of clients will send of `trace` (nothing in an open loop), as the
        deployment's client knobs have them send it."""
        return TurnQueue(trace.requests if self.concurrency is not None else (), self.concurrency,
                         ClientKnobs.of(self.deployment), self.seed)

    def sessions(self, trace: Trace) -> TurnsAfterAnswers | None:
        """An open loop's requests when its conversations' turns wait for their answers (the deployment's
        turns_after_answers, workloads/sessions.py); None otherwise."""
        if self.concurrency is None and self.deployment.turns_after_answers:
            return TurnsAfterAnswers(trace.requests)
        return None

    def trace(self) -> Trace:
        arrival = self._arrival()
        try:
            trace = make_trace(self.workload, num_requests=self.requests, rate=self.arrival_rate, seed=self.seed,
                               ramp_up=self.ramp_up, **dict(self.params), **arrival)
        except TraceError as exc:
            raise PlannerError(str(exc)) from None
        try:       # (before the live run: what its clients would refuse)
            check_clients(self.concurrency, ClientKnobs.of(self.deployment), conversations_in(trace))
        except ValueError as exc:
            raise PlannerError(str(exc)) from None
        return trace.scaled(length_scale=self.length_scale, max_prompt_len=self.max_prompt_len,
                            max_output_len=self.max_output_len)
