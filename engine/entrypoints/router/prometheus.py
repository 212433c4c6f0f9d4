"""Prometheus text exposition: read the replicas' /metrics pages and aggregate them as Prometheus would.

A fleet's dashboard sums a counter or a histogram over replicas
(`sum without (instance) (rate(...))`), while a gauge only means something
per replica (one replica's KV-cache usage, its queue). So the proxy's
/metrics sums counters, histograms and summaries sample by sample (same
name, same labels) over the replicas that answered, and repeats every gauge
once per replica with a `replica` label, as a scrape of each replica would
store it.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

SUMMED = ("counter", "histogram", "summary")
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass
class Family:
    name: str
    kind: str = "untyped"
    help: str = ""
    samples: list[tuple[str, tuple[tuple[str, str], ...], float]] = field(default_factory=list)


def parse(text: str) -> dict[str, Family]:
    """The families of one page, in page order; samples belong to the family whose TYPE came last
    (or, untyped, to one of their own name)."""
    families: dict[str, Family] = {}
    current: Family | None = None
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                current = families.setdefault(parts[2], Family(parts[2]))
                if parts[1] == "TYPE":
                    current.kind = parts[3].strip() if len(parts) > 3 else "untyped"
                else:
                    current.help = parts[3] if len(parts) > 3 else ""
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        name, labels, value = match.groups()
        if current is None or not name.startswith(current.name):
            current = families.setdefault(name, Family(name))
        try:
            number = float(value)
        except ValueError:
            continue
        current.samples.append((name, tuple(_LABEL.findall(labels or "")), number))
    return families


def aggregate(pages: list[dict[str, Family] | None]) -> list[Family]:
    """One family per name over every replica's page (None: a replica that did not answer): counters,
    histograms and summaries summed per (sample, labels), anything else kept per replica."""
    merged: dict[str, Family] = {}
    sums: dict[str, dict] = {}
    for replica, page in enumerate(pages):
        for family in (page or {}).values():
            out = merged.setdefault(family.name, Family(family.name, family.kind, family.help))
            if family.kind in SUMMED:
                totals = sums.setdefault(family.name, {})
                for name, labels, value in family.samples:
                    key = (name, labels)
                    totals[key] = totals.get(key, 0.0) + value
            else:
                out.samples += [(name, labels + (("replica", str(replica)),), value)
                                for name, labels, value in family.samples]
    for name, totals in sums.items():
        merged[name].samples = [(sample, labels, value) for (sample, labels), value in totals.items()]
    return list(merged.values())


def render(families: list[Family]) -> str:
    lines: list[str] = []
    for family in families:
        if family.help:
            lines.append(f"# HELP {family.name} {family.help}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        for name, labels, value in family.samples:
            text = ",".join(f'{k}="{v}"' for k, v in labels)
            lines.append(f"{name}{{{text}}} {_number(value)}" if text else f"{name} {_number(value)}")
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    if math.isfinite(value) and value == int(value) and abs(value) < 2 ** 53:
        return str(int(value))
    return repr(value) if math.isfinite(value) else ("+Inf" if value > 0 else "-Inf" if value < 0 else "NaN")


def gauge_value(page: dict[str, Family], name: str) -> float | None:
    """The first sample of a gauge on one page (e.g. vllm:kv_cache_usage_perc), or None."""
    family = page.get(name)
    return family.samples[0][2] if family is not None and family.samples else None
