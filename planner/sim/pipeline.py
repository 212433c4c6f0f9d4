"""Pipeline parallelism (vLLM's --pipeline-parallel-size): the layers in pp stages, pp batches in flight.

vLLM splits a model's layers into pp consecutive stages (vllm/distributed/utils.py `get_pp_indices`:
L // pp layers each, the remainder one more to each stage before the last), each on its own tp GPUs,
and passes each stage's hidden states and residual to the next (`IntermediateTensors`, every TP rank
sending its slice). Its engine core keeps pp batches in flight (vllm/v1/engine/core.py
`step_with_batch_queue`, `max_concurrent_batches` = pp): it schedules a batch and hands it to the first
stage without waiting, until pp batches are in flight, nothing is left to schedule or the oldest batch
is back, then waits for the oldest, applies its tokens and schedules again. A request that arrives meanwhile waits
for that. The scheduler counts a batch's tokens computed as it schedules them, so a request whose
tokens are all in flight gets none in the next batch ("PP>1 and we have already scheduled all prompt
tokens but they are not finished yet", vllm/v1/core/sched/scheduler.py), while a long prompt gets its
next chunk: requests fall into groups that take turns through the pipeline.

Here `PipelinedScheduler` is the engine's vLLM v1 scheduler with that accounting, and `PipelinedEngine`
the simulator's engine process with the batch queue, one step at a time. A batch takes each stage in
turn, a stage priced as the whole step times the largest stage's share of the layers (`Stages`); it
enters a stage once the stage is free and its hidden states have arrived from the one before. The
host's scheduling overlaps the batches in flight, so a stage is priced at the GPU's time (the cost
model's async-scheduling price).

Async scheduling changes none of this. vLLM 0.11 refused it with PP ("Async scheduling is not supported
with pipeline-parallel-size > 1"); since vllm-project/vllm#32359 (January 2026) it runs them together "with
constraints": no request has two tokens scheduled at once, which is the accounting above, and its batch
queue still holds pp batches (`VllmConfig.max_concurrent_batches`).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from engine.core.chunked_scheduler import ChunkedScheduler
from engine.core.metrics import StepRecord
from engine.core.scheduler import Samples, Scheduler, SchedulerOutput
from engine.core.sequence import SequenceGroup, SequenceStatus
from engine.core.step import Step, begin_step
from planner.catalog import GpuSpec, ModelSpec
from planner.cost.nodes import NODE_LINK, node_link
from planner.cost.shape import StepShape, reads_context_histogram, step_shape
from planner.deploy.parallel import largest_stage
from planner.errors import PlannerError


def host_hidden(deployment) -> bool:
    """Whether a step is priced with the host's time hidden behind the GPU's: under async scheduling, or
    with pipeline stages, whose batch queue overlaps the host with the batches in flight."""
    return bool(deployment.async_scheduling) or deployment.pp > 1


@dataclass(frozen=True, slots=True)
class Stages:
    """The pipeline's price: `pp` stages, the largest holding `share` of the layers; `send_latency` +
    `send_per_token` x tokens to pass a batch's hidden states and residual to the next stage."""

    pp: int
    share: float
    send_latency: float
    send_per_token: float
    link: str

    @classmethod
    def of(cls, model: ModelSpec, gpu: GpuSpec, tp: int, pp: int, dtype_bytes: int = 2,
           link: str = NODE_LINK) -> Stages:
        """Over the GPUs' NVLink (or PCIe) inside one node; over one NIC per GPU on the `link` between nodes
        once tp x pp GPUs take more than one node (planner/cost/nodes.py), as some stage boundary then
        crosses nodes."""
        share = largest_stage(model.num_layers, pp) / model.num_layers
        per_gpu = 2 * model.hidden_size * dtype_bytes / tp      # hidden states and residual, a TP rank's slice
        if tp * pp <= gpu.node_gpus:
            if gpu.interconnect_bandwidth <= 0:
                raise PlannerError(f"--pp {pp}: {gpu.name} has no link to pass a stage's hidden states on")
            return cls(pp, share, gpu.interconnect_latency, per_gpu / gpu.interconnect_bandwidth, gpu.interconnect)
        nic = node_link(link)
        return cls(pp, share, nic.latency, per_gpu / nic.bandwidth, nic.name)

    def stage_seconds(self, step_seconds: float) -> float:
        return step_seconds * self.share

    def send_seconds(self, shape: StepShape) -> float:
        return self.send_latency + shape.total_tokens * self.send_per_token


class PipelinedScheduler(ChunkedScheduler):
    """vLLM v1's scheduler with batches in flight: `launch` counts a scheduled batch's tokens computed;
    `land` applies a batch that came back, less the requests preempted or ended since it left."""

    def launch(self, out: SchedulerOutput) -> tuple[SchedulerOutput, list[int]]:
        """The batch `out` goes into the pipeline (call after its shape is read): the part that samples
        when it comes back, and its groups' preemption counts now."""
        sampling = out.sampling_part()
        for seq, n in zip(out.seqs, out.num_scheduled_tokens):
            seq.num_computed_tokens += n
        return sampling, [g.num_preemptions for g in sampling.groups]

    def land(self, sampling: SchedulerOutput, preemptions: list[int], samples: Samples,
             now: float) -> list[SequenceGroup]:
        """A batch back from the last stage: its sampled tokens, for the requests still running as they
        were when it left (a request preempted meanwhile recomputes; vLLM drops what comes back for it).
        One sequence per group here (vLLM v1), so groups and sequences pair up."""
        kept = [(g, s) for g, s, n in zip(sampling.groups, sampling.seqs, preemptions)
                if g.num_preemptions == n and s.status is SequenceStatus.RUNNING]
        if not kept:
            return []
        if len(kept) < len(sampling.groups):
            sampling = SchedulerOutput(sampling.is_prefill, [g for g, _ in kept], [s for _, s in kept], len(kept))
        return Scheduler.update(self, sampling, samples, now)


@dataclass(slots=True)
class Flight:
    """A batch in the pipeline: its schedule, shape and sampling part, and when it comes back."""

    step: Step
    shape: StepShape
    sampling: SchedulerOutput
    preemptions: list[int]
    num_running: int
    back: float


def pipelined_run(engine, stages: Stages, step_time):
    """The engine process of a pipelined deployment (see the module docstring); `engine` is a
    SimulatedEngine whose scheduler is a PipelinedScheduler, stepping one batch at a time."""
    env, scheduler = engine.env, engine.scheduler
    histogram = reads_context_histogram(engine.cost_model)
    flights: deque[Flight] = deque()
    free = [0.0] * stages.pp            # when each stage finishes the batch it holds
    while True:
        # vLLM's loop: schedule a batch; go on scheduling while the queue has room and the oldest batch is
        # not back yet, else take the oldest back (waiting for it)
        if len(flights) < stages.pp:
            step = begin_step(scheduler, env.now)
            if step.has_work:
                flights.append(_launch(engine, step, stages, step_time, free, histogram))
                if len(flights) < stages.pp and flights[0].back > env.now:
                    continue
            elif engine.settle(step.out):
                continue
            elif not flights:
                if engine.check_done():
                    return
                engine.idle = env.event()
                yield engine.idle
                continue
        flight = flights.popleft()
        if flight.back > env.now:
            yield env.timeout(flight.back - env.now)
        yield from engine._stepped(1, env.now, _land(engine, flight, env.now))


def _launch(engine, step: Step, stages: Stages, step_time, free: list[float], histogram: bool) -> Flight:
    """A batch into the pipeline: priced, its tokens counted computed, and when it comes back."""
    shape = step_shape(step.out, histogram)
    stage = stages.stage_seconds(step_time(shape))
    send = stages.send_seconds(shape)
    at = engine.env.now
    for k in range(stages.pp):
        at = max(at + (send if k else 0.0), free[k]) + stage
        free[k] = at
    sampling, preemptions = engine.scheduler.launch(step.out)
    return Flight(step, shape, sampling, preemptions, len(engine.scheduler.running), at)


def _land(engine, flight: Flight, end: float) -> list[SequenceGroup]:
    """A batch back: its tokens applied and its record kept; the requests that ended."""
    step, out = flight.step, flight.step.out
    finished = list(out.finished_now)
    if flight.sampling.groups:
        samples = engine.executor.samples(flight.sampling)
        finished += engine.scheduler.land(flight.sampling, flight.preemptions, samples, end)
    if engine.kv_events is not None:          # a prefix-aware router reads the blocks cached by then
        engine._tag_events(end)
    engine.steps.append(StepRecord.from_output(out, step.start, end, step.breakdown, step.blocks_used))
    engine.shapes.append(flight.shape)
    engine.num_running.append(flight.num_running)
    return finished
