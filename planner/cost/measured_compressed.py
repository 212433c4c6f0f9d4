"""DeepSeek-V4 in the measured model: its attention and hyper-connections as NVIDIA timed them in vLLM 0.24.

aiconfigurator-core times one DeepSeek-V4 layer's whole attention module (scripts/extract_measured_tables.py:
`dsv4_context`, `dsv4_generation`): the FP8 projections (wq_a, wq_b, wkv, the grouped wo_a, wo_b), the
compressors, the CSA layer's indexer and top-k, FlashMLA's sparse attention over the window and the picked
or pooled rows, the norms, rotary and cache writes inside it; the all-reduce after wo_b is not in it. It
times a CSA layer (compress ratio 4) and an HCA layer (128) apart, for the released models' shapes, by the
heads on one GPU:
- decode: `batch_size` sequences that each hold `step` cached tokens (the new one is one more);
- prefill: `batch_size` prompts of `isl` tokens over a cached prefix of `step` tokens (0, 128, 2,048,
  4,096 and 65,536 - isl).
A V4-Flash layer at TP 2 decoding 64 sequences of 4,096 tokens takes 0.138 ms (CSA) and 0.080 ms (HCA) on
H200, 3-4x what the roofline's bytes and FLOPs give (bench/bench_deepseek_v4.py): the module's many small
kernels. The two window-only layers of V4-Flash have no table; aiconfigurator prices them as HCA layers.
Here a window-only layer costs what an HCA layer costs before it holds any pooled row: decode at a context
of at most the window, prefill over no cached prefix (it reads the window's keys only; the HCA compressor's
own small work stays in, a slight overcharge on 2 of 43 layers).

The layer kinds are averaged per timed point into one table per phase, so the measured model prices V4's
decode as it prices every model's: `attention_layers` x the per-layer curve T(b, c) of each sequence's context.
Prefill is looked up at the step's mean prompt length and mean cached prefix; along the prefix, each timed
prompt length is interpolated at its own total (prompt + prefix), so a fresh prompt reads the no-prefix row.

The hyper-connections (`mhc`: vLLM's tilelang mhc_pre and mhc_post kernels, timed by tokens with num_sites 2)
are outside the attention module and are their own ledger term. As aiconfigurator counts them, a layer pays
one `pre` and one `post` row (vLLM fuses one block's post with the next one's pre).
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.catalog import ModelSpec, resolve_model
from planner.catalog.deepseek_v4 import CSA, HCA, SLIDING
from planner.cost import tables
from planner.cost.ledger import Term
from planner.errors import PlannerError

# The ledger's elementwise terms the timed module already holds (their names, before any layer-kind label).
MODULE_KERNELS = ("rotary embedding", "KV-cache write")


def _attention_shape(model: ModelSpec) -> tuple:
    ca = model.compressed_attention
    return (model.hidden_size, model.num_heads, model.head_size, model.q_lora_rank, ca.o_lora_rank, ca.o_groups,
            ca.window, ca.indexer)


def _timed_model(system: str, model: ModelSpec) -> str | None:
    """The first model NVIDIA timed with `model`'s attention shapes (a Hugging Face id), or None."""
    for name in sorted({r["model"] for r in tables.load_rows(system, "dsv4_generation")}):
        try:
            timed = resolve_model(name)
        except PlannerError:
            continue
        if timed.compressed_attention is not None and _attention_shape(timed) == _attention_shape(model):
            return name
    return None


def _bracket(keys: list, x: float) -> tuple:
    """The two grid values whose segment tables.interpolate reads at x (one when the grid has one)."""
    if len(keys) == 1:
        return (keys[0],)
    i = tables.segment_start(keys, x)
    return keys[i], keys[i + 1]


@dataclass(frozen=True)
class CompressedModule:
    """One DeepSeek-V4 layer's attention module, averaged over the model's kinds of layer, on one GPU."""

    generation: dict    # {batch: {cached tokens: seconds}}
    context: dict       # {batch: {prompt length: {prompt length + cached prefix: seconds}}} (the keys it attends)
    label: str          # what the tables time, in words

    @classmethod
    def of(cls, system: str, model: ModelSpec, heads: int) -> "CompressedModule | None":
        """The system's timings for `model`'s shapes at `heads` heads per GPU; None where it has none."""
        if not tables.has_table(system, "dsv4_generation"):
            return None
        name = _timed_model(system, model)
        if name is None:
            return None
        window = model.compressed_attention.window
        kinds = {spec.compress_ratio: layers for layers, spec in model.attention_kinds}
        where = {"model": name, "num_heads": heads}
        gen = {ratio: tables.build_tree(tables.load_rows(system, "dsv4_generation"), ("batch_size", "step"),
                                        where | {"compress_ratio": ratio}) for ratio in (CSA, HCA)}
        ctx = {ratio: tables.build_tree(tables.load_rows(system, "dsv4_context"), ("batch_size", "isl", "step"),
                                        where | {"compress_ratio": ratio}) for ratio in (CSA, HCA)}
        if not all(gen.values()) or not all(ctx.values()):
            return None

        def per_layer(times: dict) -> float:
            return sum(kinds.get(ratio, 0) * t for ratio, t in times.items()) / sum(kinds.values())

        generation: dict = {}
        for b, by_step in gen[CSA].items():
            hca = gen[HCA].get(b, {})
            for step, y in by_step.items():
                if step in hca and min(step, window) in hca:
                    generation.setdefault(b, {})[step] = per_layer({CSA: y, HCA: hca[step],
                                                                    SLIDING: hca[min(step, window)]})
        context: dict = {}
        for b, by_isl in ctx[CSA].items():
            for isl, by_prefix in by_isl.items():
                hca = ctx[HCA].get(b, {}).get(isl, {})
                if 0 not in hca:
                    continue
                for prefix, y in by_prefix.items():
                    if prefix in hca:
                        context.setdefault(b, {}).setdefault(isl, {})[prefix] = per_layer(
                            {CSA: y, HCA: hca[prefix], SLIDING: hca[0]})
        # made monotone by prefix (the prefixes 0 to 4,096 are the same for every length), read by keys attended
        context = {b: {isl: {isl + prefix: y for prefix, y in row.items()} for isl, row in by_isl.items()}
                   for b, by_isl in tables.monotone(context, 3).items()}
        label = f"{name}'s shapes, {heads} heads, fp8 cache, fp8_block GEMMs"
        return cls(tables.monotone(generation, 2), context, label)

    def prefill(self, batch: int, length: int, prefix: int) -> tuple[float, bool]:
        """(one layer's seconds, extrapolated) for `batch` prompts of `length` tokens over `prefix` cached ones:
        along the prefix, each timed prompt length at its own total; then log-log in length and batch."""
        near: dict = {}
        extrapolated = False
        for b in _bracket(sorted(self.context), batch):
            rows = self.context[b]
            for isl in _bracket(sorted(rows), length):
                near.setdefault(b, {})[isl], ext = tables.interpolate(rows[isl], (isl + prefix,))
                extrapolated = extrapolated or ext
        latency, ext = tables.interpolate(near, (batch, length))
        return latency, extrapolated or ext


@dataclass(frozen=True)
class HyperConnections:
    """DeepSeek-V4's mHC kernels (pre and post) over every layer, by the step's tokens."""

    pre: tables.Curve
    post: tables.Curve
    layers: int
    system: str

    @classmethod
    def of(cls, system: str, model: ModelSpec) -> "HyperConnections | None":
        if not tables.has_table(system, "mhc"):
            return None
        ca, rows = model.compressed_attention, tables.load_rows(system, "mhc")
        where = {"hc_mult": ca.hc_mult, "hidden_size": model.hidden_size}
        curves = [tables.build_tree(rows, ("num_tokens",), where | {"kernel": op}) for op in ("pre", "post")]
        if not all(curves):
            return None
        return cls(*(tables.Curve.of(tables.monotone(c, 1)) for c in curves), model.num_layers, system)

    def term(self, tokens: int) -> tuple[Term, bool]:
        """The step's ledger term for `tokens` tokens, and whether the table was extrapolated."""
        (pre, e0), (post, e1) = self.pre.at(tokens), self.post.at(tokens)
        return Term("hyper-connections (mHC pre + post)", "elementwise", self.layers * (pre + post), "table",
                    f"{self.system} mhc, {tokens} tokens, one pre and one post x{self.layers} layers",
                    self.layers), e0 or e1
