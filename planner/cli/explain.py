"""`planner explain`: one step's cost ledger (every priced term, its seconds, share and source).

The measured cost model prices a step as vLLM runs it, term by term
(planner/cost/ledger.py); this command prints those terms for one step shape:
`--batch B` decode sequences at `--context C` tokens each, and with
`--prefill-tokens P` one prompt chunk of P new tokens in the same step (after
`--prefill-context` tokens already cached), as vLLM's chunked prefill mixes them.
The deployment flags are every command's (`@deployment_options`): the model, GPU,
TP, formats and the limits that set vLLM's CUDA-graph capture sizes.
"""
from __future__ import annotations

import json
import sys
from dataclasses import replace

import typer
from rich.table import Table

from planner.cli.options import DeploymentChoices, deployment_options
from planner.cli.output import fail, stdout
from planner.cost.ledger import GROUPS, Ledger
from planner.cost.lora import LoraPricer, with_lora_term
from planner.cost.measured import MeasuredCostModel
from planner.cost.offload import WeightStreamCost
from planner.cost.shape import StepShape, context_histogram, prefill_attn_pairs
from planner.deploy.plan import plan_deployment
from planner.errors import PlannerError
from planner.sim.pipeline import Stages, host_hidden

DEFAULTS = {"model": "opt-13b", "gpu": "a100-40g"}


def step(batch: int, context: int, prefill_tokens: int = 0, prefill_context: int = 0) -> StepShape:
    """The step explained: `batch` decodes at `context` tokens each, plus one prompt chunk if asked."""
    _check_shape(batch, context, prefill_tokens, prefill_context)
    contexts = [context] * batch
    chunk = 1 if prefill_tokens else 0
    return StepShape(prefill_seqs=chunk, prefill_tokens=prefill_tokens,
                     prefill_attn_pairs=prefill_attn_pairs(prefill_tokens, prefill_context) if chunk else 0,
                     decode_seqs=batch, decode_context=batch * context, decode_histogram=context_histogram(contexts),
                     prefill_context=prefill_context if chunk else 0)


def _check_shape(batch: int, context: int, prefill_tokens: int, prefill_context: int) -> None:
    if batch < 0 or prefill_tokens < 0 or prefill_context < 0 or (batch and context < 1):
        raise PlannerError("--batch, --prefill-tokens and --prefill-context must be >= 0, --context >= 1")
    if batch == 0 and prefill_tokens == 0:
        raise PlannerError("nothing to explain: give --batch B (decodes) and/or --prefill-tokens P")


def explain_ledger(deployments: DeploymentChoices, batch: int, context: int, prefill_tokens: int = 0,
                   prefill_context: int = 0) -> Ledger:
    """The measured model's ledger for the step `step()` describes, on the deployment given (planned as
    `simulate` plans it). A step vLLM would never run there is refused, before anything is sized by it."""
    _check_shape(batch, context, prefill_tokens, prefill_context)
    plan = plan_deployment(deployments.one("explain", **DEFAULTS))
    _check_runs(plan, batch, context, prefill_tokens, prefill_context)
    d = plan.deployment
    model = MeasuredCostModel(plan.model, plan.gpu, tp=d.tp, dtype_bytes=plan.dtype_bytes, block_size=d.block_size,
                              weight_format=plan.weight_format, kv_cache_dtype=d.kv_cache_dtype,
                              max_num_seqs=d.max_num_seqs, max_num_batched_tokens=plan.max_num_batched_tokens,
                              async_scheduling=host_hidden(d), moe=plan.moe_parallel,
                              node_link=d.node_link, custom_all_reduce=not d.disable_custom_all_reduce,
                              performance_mode=d.performance_mode, speculative_tokens=d.num_speculative_tokens)
    if plan.cpu_offload_bytes_per_gpu:     # --cpu-offload-gb: every forward reads those weights over the host link
        model = WeightStreamCost(model, plan.cpu_offload_bytes_per_gpu, plan.gpu.host_link_bandwidth)
    shape = step(batch, context, prefill_tokens, prefill_context)
    ledger = model.ledger(shape)
    if d.enable_lora:          # the most adapters a step may run: --max-loras
        pricer = LoraPricer(plan.model, plan.gpu, d.tp, d.max_lora_rank, model.calibration.elementwise_floor_s,
                            plan.dtype_bytes)
        ledger = with_lora_term(ledger, pricer, shape.total_tokens, min(d.max_loras, shape.batch_size))
    if plan.warnings:           # what `simulate` warns of the same deployment
        ledger = replace(ledger, notes=(*ledger.notes, *(f"warning: {w}" for w in plan.warnings)))
    if d.pp == 1:
        return ledger
    stages = Stages.of(plan.model, plan.gpu, d.tp, d.pp, plan.dtype_bytes, d.node_link)
    sends = f"{d.pp - 1} send{'s' if d.pp > 2 else ''}"
    note = (f"--pp {d.pp}: the largest stage holds {stages.share:.1%} of the layers and takes "
            f"{stages.stage_seconds(ledger.total) * 1e3:.3f} ms of this step; a batch passes {d.pp} stages and "
            f"{sends} of {stages.send_seconds(shape) * 1e6:.1f} us ({stages.link}), pp batches in flight "
            f"(planner/sim/pipeline.py)")
    return replace(ledger, notes=(*ledger.notes, note))


def _check_runs(plan, batch: int, context: int, prefill_tokens: int, prefill_context: int) -> None:
    """What vLLM's scheduler never puts in one step on this deployment: a sequence past max_model_len, more
    sequences than max_num_seqs, more new tokens than the token budget, more cached tokens than the KV cache."""
    d, spec = plan.deployment, plan.model
    longest = max(context if batch else 0, prefill_context + prefill_tokens)
    if longest > plan.max_model_len:
        raise PlannerError(f"a sequence of {longest} tokens is longer than the deployment's max_model_len "
                           f"{plan.max_model_len}: vLLM never runs one past it (--max-model-len sets it)")
    sequences = batch + (1 if prefill_tokens else 0)
    if sequences > d.max_num_seqs:
        raise PlannerError(f"{sequences} sequences in one step, more than max_num_seqs {d.max_num_seqs}: vLLM "
                           f"never schedules more (--max-num-seqs sets it)")
    if batch + prefill_tokens > plan.max_num_batched_tokens:
        raise PlannerError(f"{batch + prefill_tokens} new tokens in one step, more than the token budget "
                           f"{plan.max_num_batched_tokens}: vLLM never schedules more (--max-num-batched-tokens)")
    # A cache of plain attention layers only: every cached token takes a slot of every block (sliding,
    # linear and compressed layers keep less, which the simulator's allocator counts, not this check).
    plain = (not spec.sliding_layers and spec.linear_attention is None and spec.compressed_attention is None)
    cached = batch * context + prefill_context + prefill_tokens
    slots = plan.num_gpu_blocks * plan.block_size
    if plain and cached > slots:
        raise PlannerError(f"the step's {cached:,} cached tokens are more than the {slots:,} the KV cache "
                           f"holds: vLLM would preempt sequences first (--gpu-memory-utilization, "
                           f"--kv-cache-dtype fp8 or a larger --tp hold more)")


def ledger_table(ledger: Ledger, title: str) -> Table:
    table = Table(title=title)
    for col in ("term", "ms", "share", "source", "what was priced"):
        table.add_column(col, justify="right" if col in ("ms", "share") else "left")
    order = {g: i for i, g in enumerate(GROUPS)}
    for i, row in sorted(enumerate(ledger.rows()), key=lambda x: (order[x[1]["group"]], x[0])):
        table.add_row(row["term"], f"{row['seconds'] * 1e3:.3f}", f"{row['share']:.1%}", row["source"],
                      row["detail"])
    table.add_row("total", f"{ledger.total * 1e3:.3f}", "100.0%", "", "", style="bold")
    return table


@deployment_options
def explain(
    deployments: DeploymentChoices,
    batch: int = typer.Option(..., "--batch", "-b", help="decode sequences in the step"),
    context: int = typer.Option(1024, "--context", "-c", help="tokens each decode sequence attends to"),
    prefill_tokens: int = typer.Option(0, "--prefill-tokens", help="new tokens of one prompt chunk in the same step"),
    prefill_context: int = typer.Option(0, "--prefill-context", help="tokens of that prompt already cached"),
    as_json: bool = typer.Option(False, "--json", help="print the ledger as one JSON document"),
) -> None:
    """One step's cost ledger on the measured model: every term, its seconds, share and source."""
    try:
        ledger = explain_ledger(deployments, batch, context, prefill_tokens, prefill_context)
    except (PlannerError, ValueError) as exc:
        raise fail(exc) from None
    if as_json:
        sys.stdout.write(json.dumps(ledger.as_dict()) + "\n")
        return
    shown = f"{batch} decodes at {context} tokens" + (f" + a {prefill_tokens}-token prompt chunk" if prefill_tokens
                                                      else "")
    padded = f", run as {ledger.padded_tokens}" if ledger.padded_tokens != ledger.tokens else ""
    console = stdout()
    console.print(ledger_table(ledger, f"one step: {shown} ({ledger.tokens} tokens{padded})"))
    console.print(f"cost model: {ledger.cost_model}", highlight=False, markup=False)
    for note in ledger.notes:
        console.print(f"  {note}", highlight=False, markup=False)
