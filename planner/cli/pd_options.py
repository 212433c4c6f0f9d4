"""The options of prefill/decode disaggregation (`--pd P:D`, and through `@pool_options` each pool's GPU, TP
and settings and the KV link), declared once for simulate, capacity and search (docs/pd.md)."""
from __future__ import annotations

import inspect
from typing import Optional

import typer

from planner.cli.options import options_as
from planner.errors import PlannerError
from planner.runs.pd import POOL_KEYS, Disaggregation, parse_pd, parse_pool_set
from planner.runs.pipeline import plan_pools

PD = typer.Option(None, "--pd", metavar="P:D",
                  help="disaggregated prefill: a pool of P prefill replicas and a pool of D decode replicas "
                       "(vLLM's disaggregated serving with a KV connector), each request prefilled in one, its KV "
                       "sent over --kv-link, decoded in the other; needs --policy vllm-v1 (docs/pd.md)")
PREFILL_GPU = typer.Option(None, "--prefill-gpu", help="with --pd: the prefill pool's GPU [default: --gpu]")
PREFILL_TP = typer.Option(None, "--prefill-tp", help="with --pd: the prefill pool's TP [default: --tp]")
DECODE_GPU = typer.Option(None, "--decode-gpu", help="with --pd: the decode pool's GPU [default: --gpu]")
DECODE_TP = typer.Option(None, "--decode-tp", help="with --pd: the decode pool's TP [default: --tp]")
KV_LINK = typer.Option(None, "--kv-link", help="with --pd: the link the KV caches cross: nvlink (one node), "
                                               "infiniband (NDR 400 Gb/s per GPU) or ethernet (100 GbE) "
                                               "[default: infiniband]")
PREFILL_SET = typer.Option(None, "--prefill-set", metavar="KEY=VALUE",
                           help=f"with --pd: a deployment setting of the prefill pool alone ({', '.join(POOL_KEYS)}),"
                                f" e.g. max_num_batched_tokens=16384 or all2all_backend=deepep_high_throughput; "
                                f"repeatable")
DECODE_SET = typer.Option(None, "--decode-set", metavar="KEY=VALUE",
                          help="with --pd: a deployment setting of the decode pool alone, as --prefill-set, e.g. "
                               "max_num_seqs=512 or all2all_backend=deepep_low_latency; repeatable")
# Each pool option: its parameter's name, type and typer option.
_POOL_OPTIONS = (("prefill_gpu", Optional[str], PREFILL_GPU), ("prefill_tp", Optional[int], PREFILL_TP),
                 ("decode_gpu", Optional[str], DECODE_GPU), ("decode_tp", Optional[int], DECODE_TP),
                 ("kv_link", Optional[str], KV_LINK), ("prefill_set", Optional[list[str]], PREFILL_SET),
                 ("decode_set", Optional[list[str]], DECODE_SET))


def pool_options(command):
    """Add the pools' options (each pool's GPU, TP and settings, the KV link) to a typer command, which receives
    the ones given as `pools`, a dict of Disaggregation's fields (a bad --prefill-set fails in one line)."""
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind)
             for name, kind, option in _POOL_OPTIONS]
    return options_as(command, "pools", added, _pools_given)


def _pools_given(options: dict) -> dict:
    for pool in ("prefill", "decode"):
        options[f"{pool}_set"] = parse_pool_set(pool, options[f"{pool}_set"]) or None
    return {k: v for k, v in options.items() if v is not None}


def refuse_without_pd(settings: dict) -> None:
    if settings:
        flag = "--" + next(iter(settings)).replace("_", "-")
        raise PlannerError(f"{flag} sets a pool of disaggregated prefill: give --pd P:D too")


def disaggregation(pd: Optional[str], settings: dict) -> Disaggregation | None:
    """--pd P:D with the pools' settings; None without --pd (a pool setting alone is an error)."""
    if pd is None:
        refuse_without_pd(settings)
        return None
    if "," in pd:
        raise PlannerError(f"--pd {pd}: one P:D here (`planner search --pd` takes a list or auto)")
    return Disaggregation(*parse_pd(pd), **settings)


def check_spec(spec) -> None:
    """A run's router and, with --pd, its pools (one line on a bad value, before anything runs)."""
    spec.router()
    if spec.pd is not None:
        plan_pools(spec)                # the pools' own checks, and a TP or setting a pool's plan refuses
