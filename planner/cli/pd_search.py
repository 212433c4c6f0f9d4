"""`planner search --pd auto|P:D,...`: prefill/decode ratios against aggregated serving at --rate, per
configuration of the grid (planner/sizing/pd_search.py); writes pd_search.json and configs.csv."""
from __future__ import annotations

import csv
import io
import json
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from planner.catalog import resolve_gpu
from planner.errors import PlannerError
from planner.runs.pd import Disaggregation, parse_pd_list
from planner.runs.spec import RunSpec
from planner.sizing.pd_search import PdSearch, aggregated_row, search_config
from planner.sizing.prices import price_table
from planner.sizing.search import SearchGrid

CSV_COLUMNS = ("gpu", "tp", "mode", "pd", "replicas", "gpus", "cost_per_hour", "meets", "binds", "saturated",
               "slo_use", "stopped_early", "note")


def parse_ratios(text: str) -> tuple[tuple[int, int], ...] | str:
    return "auto" if text.strip().lower() == "auto" else parse_pd_list(text)


def check(base: RunSpec, rate: float | None, replicas, concurrency) -> None:
    """What `search --pd` needs, one line each."""
    if rate is None or concurrency is not None:
        raise PlannerError("search --pd compares P:D ratios with aggregated serving at a target rate: give --rate "
                           "REQUESTS_PER_S (not 'max' or --concurrency)")
    if replicas is not None:
        raise PlannerError("search --pd sizes both pools and the aggregated fleet itself: leave out --replicas")
    Disaggregation(1, 1).check(base.deployment)


def run_pd_search(base: RunSpec, pools: dict, ratios, axes: dict, slos: dict, rate: float, prices: dict,
                  folder: Path, err: Console, max_replicas: int) -> dict:
    """Every (GPU, TP) of the grid: aggregated serving's fewest replicas, then the P/D search."""
    started = time.perf_counter()
    gpus = {*axes["gpu"], *(g for g in (pools.get("prefill_gpu"), pools.get("decode_gpu")) if g)}
    table = price_table(sorted(gpus), prices)
    configs = []
    for gpu in axes["gpu"]:
        for tp in axes["tp"]:
            spec = base.with_deployment(gpu=gpu, tp=tp)
            grid = SearchGrid(base=spec, slos=slos, gpus=(gpu,), tps=(tp,), target_rate=rate, replicas="auto",
                              max_replicas=max_replicas)
            aggregated = aggregated_row(grid, gpu, tp, _pricer(table))
            err.print(f"  {gpu} x{tp}: aggregated {_said(aggregated)}", highlight=False)
            search = PdSearch(spec, Disaggregation(1, 1, **pools), slos, rate, ratios, _pricer(table))
            found = search_config(search, aggregated, on_probe=lambda r: err.print(
                f"    P/D {r['pd']}: {'meets' if r['meets'] else 'misses'}" + (f" ({r['binds']} binds)" if r["binds"]
                                                                                else f" ({r['note']})"),
                highlight=False))
            if found.get("best") is not None:      # the simulation that reproduces the configuration's best
                best = found["best"]
                found["best"]["command"] = replace(spec.with_load(rate=rate), pd=Disaggregation(
                    best["prefill"], best["decode"], **pools)).command()
            configs.append({"gpu": gpu, "tp": tp, **found})
    named = ratios if ratios == "auto" else [f"{p}:{d}" for p, d in ratios]
    doc = {"target_rate": rate, "slos": slos, "ratios": named,
           "pools": pools, "router": base.fleet.router_for(base.deployment, pools=True), "configs": configs,
           "wall_time": time.perf_counter() - started,
           "prices": {g: table[g].usd_per_gpu_hour for g in table}}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pd_search.json").write_text(json.dumps(doc, indent=2))
    (folder / "configs.csv").write_text(_csv(configs))
    return doc


def _pricer(table: dict):
    """$/GPU-hour of a GPU by any of its names (the table holds catalog names)."""
    return lambda gpu: table[resolve_gpu(gpu).name].usd_per_gpu_hour


def _said(row: dict) -> str:
    if row["replicas"] is None:
        return row["note"]
    return f"{row['replicas']} replicas meet the SLOs ({row['gpus']} GPUs, ${row['cost_per_hour']:.2f}/hour)"


def _csv(configs: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for config in configs:
        for row in [config["aggregated"], *config["probes"]]:
            values = {**{c: row.get(c) for c in CSV_COLUMNS}, "gpu": config["gpu"], "tp": config["tp"]}
            writer.writerow({k: "" if v is None else v for k, v in values.items()})
    return out.getvalue()


def print_pd_search(doc: dict) -> None:
    console = Console() if Console().is_terminal else Console(width=160)
    table = Table(title=f"P/D against aggregated serving at {doc['target_rate']:g} req/s (router {doc['router']})")
    for col in ("gpu", "tp", "aggregated", "GPUs", "$/hour", "P:D", "GPUs ", "$/hour ", "binds", "one fewer prefill",
                "one fewer decode"):
        table.add_column(col)
    for config in doc["configs"]:
        agg, best = config["aggregated"], config["best"]
        near = {r["pd"]: r for r in config["neighbours"]}
        cells = ["-"] * 6
        if best is not None:
            p, d = best["prefill"], best["decode"]
            cells = [best["pd"], str(best["gpus"]), f"{best['cost_per_hour']:.2f}",
                     f"{best['binds']}" + (" (saturated)" if best["saturated"] else ""),
                     _neighbour(near.get(f"{p - 1}:{d}")), _neighbour(near.get(f"{p}:{d - 1}"))]
        table.add_row(config["gpu"], str(config["tp"]), "-" if agg["replicas"] is None else str(agg["replicas"]),
                      "-" if agg["gpus"] is None else str(agg["gpus"]),
                      "-" if agg["cost_per_hour"] is None else f"{agg['cost_per_hour']:.2f}", *cells)
    console.print(table)
    for config in doc["configs"]:
        agg, best = config["aggregated"], config["best"]
        if best is None:
            console.print(f"{config['gpu']} x{config['tp']}: {config['note']}", highlight=False)
            continue
        cheaper = "P/D" if agg["cost_per_hour"] is None or best["cost_per_hour"] < agg["cost_per_hour"] else \
            "aggregated" if agg["cost_per_hour"] < best["cost_per_hour"] else "neither (same cost)"
        console.print(f"{config['gpu']} x{config['tp']}: P/D {best['pd']} ({best['gpus']} GPUs) against aggregated "
                      f"{agg['replicas']} replicas ({agg['gpus']} GPUs): cheaper: {cheaper}", highlight=False)
        console.print(f"  simulate it: {best['command']}", highlight=False, soft_wrap=True)


def _neighbour(row: dict | None) -> str:
    if row is None:
        return "-"
    return f"{row['pd']} misses: {row['binds']} binds" if not row["meets"] else f"{row['pd']} meets"
