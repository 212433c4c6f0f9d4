"""Calibrated cost model: step time from curves fitted to a `planner profile` of a real device.

A step is priced the way the engine runs it (engine/llm_engine.py):

  forward   prefill: v(tokens) + c_pairs * attn_pairs + c_seqs * seqs + c_cached * context
            (context: the tokens already cached that its prompts continue from, whose keys the
            engine gathers back from the paged cache layer by layer; a fresh prompt has none)
            decode:  v(seqs) + c_ctx * context
            mixed (chunked prefill): the prompts' prefill terms + m(decode seqs), what
            decode rows add to a pass over a prompt chunk, timed so (the profile's
            mixed_decode) + c_ctx * their context beyond the keys m was timed at.
            A profile without m: prefill's v at prefill tokens + decode seqs (one
            pass over them all) + its attention terms + c_ctx * decode context
            + the decode rows' premium: what a decode step of those seqs costs
            beyond a one-sequence prefill of as many tokens (their LM-head rows
            and per-sequence attention set-up, which a token pass lacks)
            (ModelRunner.execute: input preparation, the model, the LM head)
  host      schedule + SequenceInput building + update: v(batch), prefill or decode flavour
  sampling  engine.sampler.Sampler over the step's logits: v(rows), greedy or random flavour

A decode sequence verifying d drafts is what the engine runs: d + 1 decode rows,
each attending to its own context (the seqs and context above count rows and
their keys: StepShape.draft_tokens and draft_keys added), sampled row by row; its
host work is one sequence's.
  swap      v(blocks) when blocks move between device and CPU (swaps, and the CPU tier's loads and stores,
            which the profiled engine copies in the step), else 0
  copy      v(blocks) for copy-on-write copies, else 0

Each v is a monotone piecewise-linear curve over the profiled grid (see
planner/profile/fit.py). step_time is the simulator's inner loop, so curves are
precomputed into per-segment (intercept, slope) lists and evaluated with one
bisect over the interior knots: plain float arithmetic, no numpy.
"""

from __future__ import annotations

from bisect import bisect_right
from pathlib import Path

from planner.catalog import GpuSpec, ModelSpec, resolve_gpu
from planner.cost.shape import StepShape
from planner.errors import PlannerError
from planner.profile.schema import CurveFit, Profile, load_profile

SAMPLING_MODES = ("greedy", "random")


class _Curve:
    """A fitted v(x): piecewise-linear through the knots, the end segments extended, never negative."""

    __slots__ = ("interior", "intercepts", "slopes")

    def __init__(self, fit: CurveFit) -> None:
        k, v = fit.knots, fit.values
        if len(k) == 1:                          # a single grid value: a constant
            self.interior, self.intercepts, self.slopes = [], [v[0]], [0.0]
            return
        self.slopes = [(v[i + 1] - v[i]) / (k[i + 1] - k[i]) for i in range(len(k) - 1)]
        self.intercepts = [v[i] - self.slopes[i] * k[i] for i in range(len(k) - 1)]
        self.interior = list(k[1:-1])            # bisect over these gives the segment index directly

    def at(self, x: float) -> float:
        i = bisect_right(self.interior, x)
        value = self.intercepts[i] + self.slopes[i] * x
        return value if value > 0.0 else 0.0


class CalibratedCostModel:
    """Step time for the profiled model on the profiled device; `sampling` picks the sampler path priced."""

    prices_each_context = False   # decode attention from the contexts' sum: StepShape.decode_histogram is not read

    def __init__(self, profile: Profile, *, source: str = "profile", sampling: str = "greedy") -> None:
        if sampling not in SAMPLING_MODES:
            raise PlannerError(f"sampling must be one of {', '.join(SAMPLING_MODES)}, got {sampling!r}")
        self.profile, self.sampling, self.source = profile, sampling, source
        self.name = f"calibrated({source})"
        fit = profile.fit
        prefill, decode = fit["prefill"].curve, fit["decode"].curve
        self._prefill = _Curve(prefill)
        self._prefill_per_pair = prefill.extras.get("attn_pairs", 0.0)
        self._prefill_per_seq = prefill.extras.get("seqs", 0.0)
        # A profile measured before prompts with a cached context were timed has no such term (0 here).
        self._prefill_per_cached = prefill.extras.get("context", 0.0)
        self._decode = _Curve(decode)
        self._decode_per_key = decode.extras.get("context", 0.0)
        # What decode rows add to a pass over a prompt chunk, timed with each row at the grid's shortest
        # context (profiles before it was timed have none: the premium is derived, _mixed_forward).
        self._mixed = _Curve(fit["mixed_decode"].curve) if "mixed_decode" in fit else None
        self._mixed_keys_per_row = min(profile.grid.decode_context)
        self._host_prefill = _Curve(fit["sched_prefill"].curve)
        self._host_decode = _Curve(fit["sched_decode"].curve)
        self._sample = _Curve(fit[f"sample_{sampling}"].curve)
        self._swap = _Curve(fit["swap"].curve)
        self._copy = _Curve(fit["copy"].curve)
        # What LoRA adapters add to a step (a profile taken with --enable-lora): v(tokens) + c * adapters.
        self.lora_rank = profile.lora_rank
        self._lora = _Curve(fit["lora"].curve) if "lora" in fit else None
        self._lora_per_adapter = fit["lora"].curve.extras.get("adapters", 0.0) if "lora" in fit else 0.0
        # Relative scatter of each component around its curve (`--timing-noise` samples it); a profile
        # written before it was kept falls back to the cross-validated error.
        self.noise_sd = {name: f.residual_sd if f.residual_sd is not None else (f.cv[f.chosen].mean_rel or 0.0)
                         for name, f in fit.items()}

    @classmethod
    def from_file(cls, path: str | Path, *, model: ModelSpec | None = None, gpu: GpuSpec | str | None = None,
                  tp: int = 1, sampling: str = "greedy") -> "CalibratedCostModel":
        """Load a profile and check it describes the requested model, GPU and tensor parallelism."""
        profile = load_profile(path)
        where = f"profile {path}"
        if profile.tp != tp:
            raise PlannerError(f"{where} was measured at tensor parallel size {profile.tp}, not {tp}")
        if gpu is not None:
            gpu = resolve_gpu(gpu)
            if profile.device.gpu != gpu.name:
                raise PlannerError(f"{where} is for GPU {profile.device.gpu!r}, not {gpu.name!r}")
        if model is not None:
            # The architecture decides timing; a folder and a catalog entry of the same shape both match.
            differs = profile.model.mismatch(model)
            if differs:
                raise PlannerError(f"{where} describes model {profile.model.name!r}, not {model.name!r} "
                                   f"({differs}): profile {model.name} (planner profile --model {model.name}) "
                                   f"or pass its profile")
        return cls(profile, source=str(path), sampling=sampling)

    def scale_decode_attention(self, factor: float) -> None:
        """Scale the decode-attention term (per context key), e.g. for another KV block size."""
        self._decode_per_key *= factor
        self.block_size_factor = getattr(self, "block_size_factor", 1.0) * factor

    def step_time(self, s: StepShape) -> float:
        """Seconds for one step. Hot path: a few bisects and float operations."""
        seqs = s.prefill_seqs + s.decode_seqs
        t = 0.0
        if s.prefill_tokens and s.decode_seqs:
            t = self._mixed_forward(s) + self._host_prefill.at(seqs)
        elif s.prefill_tokens:
            t = self._prefill.at(s.prefill_tokens) + self._prompt_terms(s) + self._host_prefill.at(seqs)
        elif s.decode_seqs:
            t = (self._host_decode.at(seqs) + self._decode.at(s.decode_seqs + s.draft_tokens)
                 + (s.decode_context + s.draft_keys) * self._decode_per_key)
        if seqs:
            t += self._sample.at(seqs + s.draft_tokens)
        if s.swap_blocks or s.offload_blocks:   # the profiled engine copies CPU-tier blocks in the step, as swaps
            t += self._swap.at(s.swap_blocks + s.offload_blocks)
        if s.copy_blocks:
            t += self._copy.at(s.copy_blocks)
        if s.lora_adapters:
            t += self.lora_time(s)
        return t

    def lora_time(self, s: StepShape) -> float:
        """What the step's LoRA adapters add to its forward pass (a profile taken with --enable-lora)."""
        if self._lora is None:
            raise PlannerError(f"{self.name} timed no LoRA adapter: profile with --enable-lora")
        return self._lora.at(s.total_tokens) + s.lora_adapters * self._lora_per_adapter

    def _prompt_terms(self, s: StepShape) -> float:
        """The prefill fit's linear terms for the step's prompts: their attention pairs, their count and the
        cached context they continue from (its keys gathered back from the paged cache)."""
        return (s.prefill_attn_pairs * self._prefill_per_pair + s.prefill_seqs * self._prefill_per_seq
                + s.prefill_context * self._prefill_per_cached)

    def _mixed_forward(self, s: StepShape) -> float:
        """The forward pass of a mixed (chunked-prefill) step: one pass over all its tokens.

        With the profile's mixed_decode: the prompts' own pass, and what the
        step's decode rows were timed to add to a pass over a chunk (their
        matmul rows, LM-head rows, the decode attention's launch), their keys
        beyond those timed at the decode curve's per-key price.

        Without it (an older profile), the prefill curve at the total prices the
        pass as if every token were a prompt token, with one LM-head row per
        prompt. Each decode row also gets an LM-head row and paged attention
        over its context; the first is the premium a decode batch of d costs
        over a one-sequence prefill of d tokens (without it a mixed step would
        price below the decode step of its decodes alone), the second the
        decode curve's per-key term. On the 2-core VM this priced mixed steps
        9-12% fast: it subtracts a prompt's attention set-up, which the chunk
        still pays.
        """
        d = s.decode_seqs + s.draft_tokens          # decode rows
        prompts = self._prompt_terms(s)
        keys = s.decode_context + s.draft_keys
        if self._mixed is not None:
            return (self._prefill.at(s.prefill_tokens) + prompts + self._mixed.at(d)
                    + (keys - d * self._mixed_keys_per_row) * self._decode_per_key)
        premium = self._decode.at(d) - self._prefill.at(d) - self._prefill_per_seq
        return self._prefill.at(s.prefill_tokens + d) + prompts + keys * self._decode_per_key + max(premium, 0.0)

    def breakdown(self, s: StepShape) -> dict[str, float]:
        """step_time by part (seconds), for reports and tests; the parts sum to step_time."""
        seqs = s.batch_size
        parts = {"forward": 0.0, "host": 0.0, "sampling": 0.0, "swap": 0.0, "copy": 0.0}
        if s.prefill_tokens and s.decode_seqs:
            parts["forward"] = self._mixed_forward(s)
            parts["host"] = self._host_prefill.at(seqs)
        elif s.prefill_tokens:
            parts["forward"] = self._prefill.at(s.prefill_tokens) + self._prompt_terms(s)
            parts["host"] = self._host_prefill.at(seqs)
        elif s.decode_seqs:
            parts["host"] = self._host_decode.at(seqs)
            parts["forward"] = (self._decode.at(s.decode_seqs + s.draft_tokens)
                                + (s.decode_context + s.draft_keys) * self._decode_per_key)
        if seqs:
            parts["sampling"] = self._sample.at(s.logit_rows)
        if s.swap_blocks or s.offload_blocks:
            parts["swap"] = self._swap.at(s.swap_blocks + s.offload_blocks)
        if s.copy_blocks:
            parts["copy"] = self._copy.at(s.copy_blocks)
        if s.lora_adapters:
            parts["forward"] += self.lora_time(s)
        return parts

    def describe(self) -> dict:
        """What this model rests on, for a result file's 'cost model' section."""
        p = self.profile
        return {
            "name": self.name, "source": "calibrated", "model": p.model.name, "gpu": p.device.gpu,
            "device_name": p.device.device_name, "tp": p.tp, "block_size": p.block_size, "dtype": p.dtype,
            "sampling": self.sampling, "created": p.created, "per_layer_scaling": p.per_layer_scaling,
            "fit": {name: {"method": f.chosen, "cv_mean_rel": f.cv[f.chosen].mean_rel} for name, f in p.fit.items()},
        }
