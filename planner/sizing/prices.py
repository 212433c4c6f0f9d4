"""GPU prices: $/GPU-hour from planner/data/prices.json (each with its source and date), overridable."""
from __future__ import annotations

import math

import json
from dataclasses import dataclass
from importlib import resources

from planner.catalog import resolve_gpu
from planner.errors import PlannerError


@dataclass(frozen=True)
class Price:
    gpu: str
    usd_per_gpu_hour: float
    source: str        # where the number comes from ("--price" for a user's override)
    date: str          # the source's date ("" for an override)
    verified: bool = True   # False: no source was found for the catalog's figure


def _catalog() -> dict:
    return json.loads(resources.files("planner").joinpath("data/prices.json").read_text(encoding="utf-8"))


def load_prices() -> dict[str, Price]:
    """The catalog's prices, by GPU name."""
    return {e["gpu"]: Price(e["gpu"], float(e["usd_per_gpu_hour"]), e["source"], e["date"], bool(e["verified"]))
            for e in _catalog()["prices"]}


def unpriced() -> dict[str, str]:
    """GPUs of the hardware catalog with no list price, and why."""
    return {e["gpu"]: e["why"] for e in _catalog().get("unpriced", [])}


def parse_price_overrides(texts: list[str]) -> dict[str, float]:
    """'h100-sxm=2.49' (or several, comma-separated) -> {the GPU's catalog name: $/GPU-hour}."""
    prices: dict[str, float] = {}
    for text in texts:
        for item in filter(None, (t.strip() for t in text.split(","))):
            gpu, sep, value = item.partition("=")
            try:
                price = float(value.strip().lstrip("$"))
            except ValueError:
                price = float("nan")
            if not sep or not gpu.strip() or not 0 <= price < math.inf:
                raise PlannerError(f"--price {item!r}: expected GPU=DOLLARS_PER_GPU_HOUR, e.g. h100-sxm=2.49")
            prices[resolve_gpu(gpu.strip()).name] = price     # under the catalog's name, as --gpu's are
    return prices


def price_table(gpus: list[str], overrides: dict[str, float]) -> dict[str, Price]:
    """The price of each GPU of the search, under its catalog name: an override, else the catalog's; a clear
    error if neither."""
    catalog = load_prices()
    table = {}
    gpus = list(dict.fromkeys(resolve_gpu(gpu).name for gpu in gpus))
    for gpu in gpus:
        if gpu in overrides:
            table[gpu] = Price(gpu, overrides[gpu], "--price", "")
        elif gpu in catalog:
            table[gpu] = catalog[gpu]
        else:
            why = unpriced().get(gpu) or f"planner/data/prices.json has {', '.join(sorted(catalog))}"
            raise PlannerError(f"no price for GPU {gpu!r} ({why}); give one with --price {gpu}=DOLLARS_PER_GPU_HOUR")
    unused = sorted(set(overrides) - set(gpus))
    if unused:
        raise PlannerError(f"--price for {', '.join(unused)}, which is not among --gpus {','.join(gpus)}")
    return table
