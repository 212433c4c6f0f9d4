"""The options of prefill/decode disaggregation (`--pd P:D` and each pool's GPU, TP and link), declared once
for simulate, capacity and search (docs/pd.md)."""
from __future__ import annotations

from typing import Optional

import typer

from planner.errors import PlannerError
from planner.runs.pd import PD_FLAGS, Disaggregation, parse_pd

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


def pool_settings(prefill_gpu: Optional[str], prefill_tp: Optional[int], decode_gpu: Optional[str],
                  decode_tp: Optional[int], kv_link: Optional[str]) -> dict:
    """The pools' settings that were given (GPU, TP, link)."""
    values = dict(zip(PD_FLAGS, (prefill_gpu, prefill_tp, decode_gpu, decode_tp, kv_link)))
    return {k: v for k, v in values.items() if v is not None}


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
        spec.pd.check(spec.deployment, spec.fleet.replicas)
