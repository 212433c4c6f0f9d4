"""`planner profile` end to end: pick the device, build the model, time every grid point, fit, write.

The plan (every grid point of every component) is built first so the progress
bar knows its total; each point is then one timing. Model-dependent points
(forward, swap, copy) run on the full model, or on a 1-layer and a 2-layer model
combined as fixed + layers * per-layer when the full model does not fit. Only
one runner exists at a time: each sizes its KV cache from the memory left
free, so a second one built beside the first would find none.
"""

from __future__ import annotations

import datetime
import random
import tempfile
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

import cuda_ext

from engine.core.config import SUPPORTED_BLOCK_SIZES   # what the engine's kernels are built for
from engine.deployment import Deployment
from engine.lora import LoRARequest, write_random_adapter
from engine.model_runner import ModelRunner
from planner.errors import PlannerError
from planner.profile.check import make_fingerprint
from planner.catalog import ModelSpec, resolve_model
from planner.profile.schema import PROFILE_SCHEMA_VERSION, DeviceInfo, Grid, Measurement, ModelArch, Profile
from planner.profile import pieces
from planner.profile.options import ProfileOptions
from planner.profile.checkpoints import build_checkpoint, needs_per_layer
from planner.profile.device import Target, device_info, resolve_target
from planner.profile.components import DIFFERENCE_COMPONENTS
from planner.profile.fit import fit_all
from planner.profile.routing import measure_experts_touched
from planner.profile.grid import decode_points, make_grid, prefill_context_points, prefill_points


UNSTEADY_SPREAD = 0.3    # (p90 - p10) / median of a point's repetitions above this: time it again


@dataclass
class _Point:
    component: str
    features: dict[str, float]
    measure: Callable[[ModelRunner | None], list[float]]   # gets the runner to time (None: model-independent)
    per_model: bool                                        # depends on the model's layers


def _check(opts: ProfileOptions) -> None:
    d = opts.deployment
    if d.tp != 1:
        raise PlannerError(f"--tp {d.tp}: the engine runs on one device, so only --tp 1 can be profiled")
    if d.block_size not in SUPPORTED_BLOCK_SIZES:
        raise PlannerError(f"--block-size {d.block_size}: the kernels support "
                           f"{', '.join(map(str, SUPPORTED_BLOCK_SIZES))}")


def _plan(grid, runner: ModelRunner, target: Target, block_size: int) -> tuple[list[_Point], list[str]]:
    # Each call times one repetition; run_profile repeats the whole grid in rounds.
    sync, w, r = target.sync, 0, 1
    rng = random.Random(0)
    # Plain values only: a closure over `runner` would keep it (and its KV cache) alive.
    vocab_size, num_gpu_blocks = runner.vocab_size, runner.num_gpu_blocks
    points: list[_Point] = []
    for tokens, seqs in prefill_points(grid, runner.max_model_len):
        length = tokens // seqs
        features = {"tokens": tokens, "attn_pairs": seqs * length * (length + 1) // 2, "seqs": seqs, "context": 0}
        points.append(_Point("prefill", features, lambda run, t=tokens, s=seqs: pieces.time_forward(
            run, pieces.prefill_inputs(run, t, s, rng), sync, w, r), True))
    for tokens, context in prefill_context_points(grid, runner.max_model_len):
        pairs = tokens * context + tokens * (tokens + 1) // 2      # each new token sees the cache and those before it
        features = {"tokens": tokens, "attn_pairs": pairs, "seqs": 1, "context": context}
        points.append(_Point("prefill", features, lambda run, t=tokens, c=context: pieces.time_forward(
            run, pieces.prefill_inputs(run, t, 1, rng, c), sync, w, r), True))
    decode, notes = decode_points(grid, block_size)
    for batch, context in decode:
        points.append(_Point("decode", {"seqs": batch, "context": batch * context},
                             lambda run, b=batch, c=context: pieces.time_forward(
                                 run, pieces.decode_inputs(run, b, c, rng), sync, w, r), True))
    for batch in grid.host_batch:
        points.append(_Point("sched_prefill", {"seqs": batch},
                             lambda _, b=batch: pieces.time_host_prefill(b, block_size, w, r), False))
        points.append(_Point("sched_decode", {"seqs": batch},
                             lambda _, b=batch: pieces.time_host_decode(b, block_size, w, r), False))
        for greedy in (True, False):
            points.append(_Point("sample_greedy" if greedy else "sample_random", {"seqs": batch},
                                 lambda _, b=batch, g=greedy: pieces.time_sampling(
                                     b, vocab_size, target.device, g, sync, w, r), False))
    points += _mixed_points(grid, sync, rng)
    if runner.lora is not None:
        points += _lora_points(grid, runner, sync, rng)
    for blocks in grid.block_counts:
        points.append(_Point("swap", {"blocks": blocks},
                             lambda run, n=blocks: pieces.time_swap(run, n, sync, w, r), True))
        if 2 * blocks <= num_gpu_blocks:
            points.append(_Point("copy", {"blocks": blocks},
                                 lambda run, n=blocks: pieces.time_copy(run, n, sync, w, r), True))
    return points, notes


# The prompt chunk the mixed points add decode rows to: a chunk of vLLM's shape (a few dozen tokens of a
# prompt beside running decodes). Its own cost cancels out of the difference.
MIXED_CHUNK_TOKENS = 64


def _mixed_points(grid, sync, rng: random.Random) -> list[_Point]:
    """What decode rows add to a forward pass over a prompt chunk (pieces.time_mixed_decode), for each of the
    grid's decode batches at its shortest context: the rows' share of the layers' matmuls, the LM head and
    the decode attention's launch, which a mixed step pays beside the chunk's own (keys beyond that
    context are priced by the decode curve's per-key term)."""
    context = min(grid.decode_context)
    return [_Point("mixed_decode", {"seqs": batch}, lambda run, b=batch: pieces.time_mixed_decode(
        run, pieces.prefill_inputs(run, MIXED_CHUNK_TOKENS, 1, rng), pieces.decode_inputs(run, b, context, rng),
        sync), True) for batch in grid.decode_batch]


def _lora_points(grid, runner: ModelRunner, sync, rng: random.Random) -> list[_Point]:
    """What LoRA adapters add to a forward pass (pieces.time_lora): decode batches of the grid at its shortest
    context, with one adapter and with as many as max_loras allows, and single prompts of the grid's
    lengths with one; the fit is v(tokens) + c * adapters (the shrink and expand run over every token, and
    each adapter in a step is one more pair of small matmuls a layer)."""
    points, most = [], runner.lora.max_loras
    context = min(grid.decode_context)
    for batch in grid.decode_batch:
        for adapters in sorted({1, min(most, batch)}):
            points.append(_Point("lora", {"tokens": batch, "adapters": adapters},
                                 lambda run, b=batch, n=adapters: pieces.time_lora(
                                     run, pieces.decode_inputs(run, b, context, rng), n, sync), True))
    for tokens in grid.prefill_tokens:
        if tokens <= runner.max_model_len:
            points.append(_Point("lora", {"tokens": tokens, "adapters": 1},
                                 lambda run, t=tokens: pieces.time_lora(
                                     run, pieces.prefill_inputs(run, t, 1, rng), 1, sync), True))
    return points


def _with_adapters(runner: ModelRunner, folder: str) -> ModelRunner:
    """`runner` with max_loras random adapters of its max_lora_rank loaded (ids 1..max_loras), written under
    `folder`: what the LoRA points time (the model's weights are random too)."""
    lora = runner.lora
    for lora_id in range(1, lora.max_loras + 1):
        path = write_random_adapter(runner.model, f"{folder}/adapter-{lora_id}", lora.max_lora_rank, seed=lora_id)
        runner.add_lora(LoRARequest(f"profile-{lora_id}", lora_id, path))
    return runner


def _runner(folder: str, target: Target, block_size: int, num_cpu_blocks: int, grid,
            weights_of: ModelRunner | None = None, lora: Deployment | None = None,
            adapters: str | None = None) -> ModelRunner:
    """The engine's runner, sized as the engine sizes it for the largest step this grid runs.

    num_gpu_blocks=None: the engine's own KV sizing (1 GiB on CPU, profiled
    free memory on CUDA, with the grid's largest prefill as the step budget).
    `lora` (a deployment with enable_lora): the runner serves its max_loras random adapters of its
    max_lora_rank, written under `adapters`, and every forward pass runs through the LoRA hooks, as the
    engine's do then.
    """
    largest_step = max(max(grid.prefill_tokens), max(grid.decode_batch))
    max_num_seqs = max(max(grid.decode_batch) + 1, max(grid.prefill_seqs))   # + 1: a mixed point's chunk
    with_lora = lora is not None and lora.enable_lora
    try:
        runner = ModelRunner(folder, block_size=block_size, num_gpu_blocks=None, num_cpu_blocks=num_cpu_blocks,
                             dtype=target.dtype, device=target.device, max_num_batched_tokens=largest_step,
                             max_num_seqs=max_num_seqs, weights_of=weights_of, enable_lora=with_lora,
                             max_loras=lora.max_loras if with_lora else 1,
                             max_lora_rank=lora.max_lora_rank if with_lora else 16)
    except RuntimeError as exc:         # out of memory, no room for a KV cache, kernels unusable
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PlannerError(f"cannot load the model on {target.device}: {first}") from None
    except ValueError as exc:           # a model the engine serves no adapter for
        raise PlannerError(str(exc)) from None
    return _with_adapters(runner, adapters) if with_lora else runner


def _free(target: Target) -> None:
    import gc

    gc.collect()
    if target.device.type == "cuda":
        torch.cuda.empty_cache()


def require_cuda_kernels(target: Target) -> None:
    """A GPU profile must time the CUDA kernels: refuse the torch reference or a failed build."""
    if target.device.type != "cuda":
        return
    try:
        backend = cuda_ext.ops_for(target.device).backend
    except RuntimeError as exc:
        raise PlannerError(f"cannot profile {target.gpu.name}: {str(exc).splitlines()[0]}") from None
    if backend != "cuda":
        raise PlannerError(f"cannot profile {target.gpu.name} with the {backend} kernels: a GPU profile "
                           "times the CUDA kernels (unset PAGED_KERNELS)")


def run_profile(opts: ProfileOptions, progress: Callable[[str, int], None] | None = None) -> Profile:
    """Measure and fit; `progress(description, total)` is called once per grid point."""
    setup = _Setup.of(opts)
    target, spec, grid, scaled = setup.target, setup.spec, setup.grid, setup.scaled
    with tempfile.TemporaryDirectory(prefix="planner-profile-") as tmp:
        # The larger model first: it sizes the KV cache the decode grid must fit.
        layer_counts = [2, 1] if scaled else [None]
        folders = [build_checkpoint(opts.deployment.model, spec, f"{tmp}/{n or 'full'}", n) for n in layer_counts]
        runner = _runner(folders[0], target, opts.deployment.block_size, max(grid.block_counts), grid,
                         lora=opts.deployment, adapters=f"{tmp}/adapters-0")
        points = setup.plan(runner)
        samples: list[list[list[float]]] = [[[] for _ in layer_counts] for _ in points]
        per_model = [i for i, p in enumerate(points) if p.per_model]
        rounds = grid.warmup + grid.repeats
        total = rounds * (len(points) + (len(layer_counts) - 1) * len(per_model))
        for k, folder in enumerate(folders):
            if k > 0:
                del runner
                _free(target)
                runner = _runner(folder, target, opts.deployment.block_size, max(grid.block_counts), grid,
                                 lora=opts.deployment, adapters=f"{tmp}/adapters-{k}")
            # The model-independent points are timed once, beside the first runner.
            _measure(points, range(len(points)) if k == 0 else per_model, runner, k, rounds, grid.warmup,
                     samples, progress, total)
        touched = measure_experts_touched(runner, spec, grid.prefill_tokens) if spec.is_moe else []
        del runner
        _free(target)
        measurements = [_measurement(point, per_runner, spec.num_layers, scaled)
                        for point, per_runner in zip(points, samples)]
    return setup.profile(measurements).model_copy(update={"experts_touched": touched})


@dataclass
class _Setup:
    """What a profiling run settles before it times anything: device, model, grid."""
    opts: ProfileOptions
    target: Target
    info: DeviceInfo
    spec: ModelSpec
    scaled: bool
    grid: Grid

    @classmethod
    def of(cls, opts: ProfileOptions) -> "_Setup":
        _check(opts)
        target = resolve_target(opts.deployment.gpu, force=opts.force)
        require_cuda_kernels(target)
        info = device_info(target)
        spec = resolve_model(opts.deployment.model)
        scaled = opts.per_layer if opts.per_layer is not None else \
            needs_per_layer(spec, target.device, target.dtype, info.memory_bytes)
        grid = make_grid(quick=opts.quick, on_cpu=target.device.type == "cpu",
                         max_model_len=spec.max_position_embeddings, kv_cache_blocks=0,
                         repeats=opts.repeats, **opts.grid_overrides)
        return cls(opts, target, info, spec, scaled, grid)

    def plan(self, runner: ModelRunner) -> list[_Point]:
        """The grid's points for the first runner built; it sizes the decode grid."""
        grid, spec = self.grid, self.spec
        # Decode points are limited to what the engine's KV cache for the FULL model would hold:
        # a scaled run sizes it from the 2-layer runner's bytes, spread over all layers.
        grid.kv_cache_blocks = (runner.num_gpu_blocks * 2 // spec.num_layers if self.scaled
                                else runner.num_gpu_blocks)
        points, notes = _plan(grid, runner, self.target, self.opts.deployment.block_size)
        grid.notes.extend(notes)
        if self.scaled:
            grid.notes.append(f"{spec.num_layers}-layer model timed as 1- and 2-layer models: "
                              f"t = t1 + {spec.num_layers - 1} * (t2 - t1)")
        return points

    def profile(self, measurements: list[Measurement], grid: Grid | None = None) -> Profile:
        if self.target.device.type == "cuda":
            torch.cuda.empty_cache()
        dtype = str(self.target.dtype).removeprefix("torch.")
        return Profile(
            schema_version=PROFILE_SCHEMA_VERSION,
            created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            device=self.info, model=ModelArch.of(self.spec), tp=self.opts.deployment.tp, block_size=self.opts.deployment.block_size,
            dtype=dtype, per_layer_scaling=self.scaled, grid=grid or self.grid,
            measurements=measurements, fit=fit_all(measurements),
            lora_rank=self.opts.deployment.max_lora_rank if self.opts.deployment.enable_lora else None,
            fingerprint=make_fingerprint(self.info, dtype=dtype, block_size=self.opts.deployment.block_size, tp=self.opts.deployment.tp),
        )


class ProfileSession:
    """A profile timed on one kept runner a point at a time, at the caller's pace, and fitted on demand.

    `planner validate` interleaves its points with the steps of a live run
    (planner/profile/along.py), so that the profile samples the same minutes
    of a drifting device as the run. Only a full-model profile can be timed this
    way: a per-layer scaled one times two models in turn.

    `beside`: the live engine's runner, whose loaded model the session times (its
    own KV cache apart), rather than a random-weight copy of the model built here:
    the profile then times the very weights, in the very memory, that the run's
    steps read.
    """

    def __init__(self, opts: ProfileOptions, beside: ModelRunner | None = None):
        self.setup = _Setup.of(opts)
        if self.setup.scaled:
            raise PlannerError(f"{opts.deployment.model} does not fit on {opts.deployment.gpu} whole: its profile times a 1- and a "
                               "2-layer model in turn, which cannot be interleaved with a live run")
        grid = self.setup.grid
        self._tmp = tempfile.TemporaryDirectory(prefix="planner-profile-")     # a checkpoint, the adapters
        if beside is None:
            folder = build_checkpoint(opts.deployment.model, self.setup.spec, f"{self._tmp.name}/full", None)
        else:
            folder = beside.model_path
        self.runner = _runner(folder, self.setup.target, opts.deployment.block_size, max(grid.block_counts), grid,
                              weights_of=beside, lora=opts.deployment, adapters=f"{self._tmp.name}/adapters")
        self.points = self.setup.plan(self.runner)
        self.samples: list[list[list[float]]] = [[[]] for _ in self.points]
        self.timer = RoundTimer(self.points, range(len(self.points)), self.runner, 0, grid.warmup, self.samples)

    def profile(self) -> Profile:
        """The profile of every point timed so far (the grid's repeats say how many rounds are in it)."""
        timed = [(p, s) for p, s in zip(self.points, self.samples) if s[0]]
        rounds = max(1, self.timer.rounds_done - self.timer.warmup)
        return self.setup.profile([_measurement(p, s, self.setup.spec.num_layers, False) for p, s in timed],
                                  self.setup.grid.model_copy(update={"repeats": rounds}))

    def close(self) -> None:
        del self.runner, self.timer
        _free(self.setup.target)
        self._tmp.cleanup()


def _measure(points: list[_Point], which, runner: ModelRunner, k: int, rounds: int, warmup: int,
             samples: list[list[list[float]]], progress, total: int) -> None:
    """Time the points `which` with runner k: `rounds` rounds, then again any that scatter widely."""
    timer = RoundTimer(points, which, runner, k, warmup, samples, progress, total)
    timer.time_rounds(rounds)
    timer.retime_unsteady(rounds - warmup)


class RoundTimer:
    """Times points with runner k in rounds over them, in a fresh random order each round.

    Rather than all repetitions of one point back to back: a slow spell of the
    machine (other tenants, frequency changes) then spreads over every point
    instead of biasing a few, and the medians stay comparable. A round may be
    timed a point at a time (`time_next`), between a live run's steps.
    """

    def __init__(self, points: list[_Point], which, runner: ModelRunner | None, k: int, warmup: int,
                 samples: list[list[list[float]]], progress=None, total: int = 0):
        self.points, self.order, self.runner, self.k, self.warmup = points, list(which), runner, k, warmup
        self.samples, self.progress, self.total = samples, progress, total
        self.shuffle = random.Random(k).shuffle
        self.queue: deque[int] = deque()    # the current round's points still to time
        self.rounds_started = 0

    @property
    def rounds_done(self) -> int:
        return self.rounds_started - (1 if self.queue else 0)

    def series(self, i: int) -> list[float]:
        return self.samples[i][self.k if self.points[i].per_model else 0]

    def _time(self, i: int, label: str) -> list[float]:
        point = self.points[i]
        if self.progress is not None:
            self.progress(f"{label}: {point.component} {point.features}", self.total)
        return point.measure(self.runner if point.per_model else None)

    def time_next(self) -> tuple[int, list[float]]:
        """Time the next point of the current round, starting a new round when it is done; returns the
        point's index and the repetitions kept (none in a warm-up round)."""
        if not self.queue:
            self.shuffle(self.order)
            self.queue.extend(self.order)
            self.rounds_started += 1
        i = self.queue.popleft()
        sample = self._time(i, f"round {self.rounds_started}")
        if self.rounds_started <= self.warmup:
            return i, []
        self.series(i).extend(sample)
        return i, sample

    def time_rounds(self, rounds: int) -> None:
        """Finish the current round, then time whole rounds until `rounds` are done."""
        while self.queue or self.rounds_started < rounds:
            self.time_next()

    def retime_unsteady(self, max_rounds: int) -> None:
        # Points whose repetitions scatter widely met a slow spell (another process on a shared CPU can
        # stall a multi-threaded matmul several-fold): time them again, up to `max_rounds` extra rounds,
        # so that their median rests on steady repetitions.
        for extra in range(max_rounds):
            # (a difference of two passes scatters about its small median by nature: not retimed)
            unsteady = [i for i in self.order if self.points[i].component not in DIFFERENCE_COMPONENTS
                        and pieces.summarize(self.series(i))[1] > UNSTEADY_SPREAD]
            if not unsteady:
                break
            self.shuffle(unsteady)
            for i in unsteady:
                self.series(i).extend(self._time(i, f"extra round {extra + 1}"))


def _measurement(point: _Point, samples: list[list[float]], num_layers: int, scaled: bool) -> Measurement:
    if not point.per_model or not scaled:
        median, spread = pieces.summarize(samples[0])
        return Measurement(component=point.component, features=point.features, median_s=median,
                           spread=spread, samples_s=samples[0])
    # samples[0] are the 2-layer model's, samples[1] the 1-layer model's (timed in that order).
    (t2, _), (t1, spread) = pieces.summarize(samples[0]), pieces.summarize(samples[1])
    # Noise can make the 2-layer model look faster; a layer never costs less than nothing.
    total = t1 + (num_layers - 1) * max(t2 - t1, 0.0)
    return Measurement(component=point.component, features=point.features, median_s=total, spread=spread,
                       samples_s=samples[1], layer_medians_s={"1": t1, "2": t2})
