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
MONOTONE = ("counter", "histogram")       # what only ever grows on one replica (a summary's quantiles do not)
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


class Counts:
    """What each replica's counters and histograms have counted, across scrapes: the sum over replicas must
    never go down (Prometheus reads a fall as a reset, and a fleet's rate() would spike), yet a replica that
    is down answers no scrape and one restarted counts again from zero. So a replica that does not answer
    counts what it last said, and one whose count fell (restarted) adds to what it had counted before, as
    Prometheus's rate() reads one instance's reset."""

    def __init__(self) -> None:
        self.families: dict[str, Family] = {}          # (name, kind and help of each family seen)
        self.counted: dict[tuple, list[float]] = {}    # (replica, family, sample, labels) -> [before reset, last]

    def update(self, replica: int, page: dict[str, Family] | None) -> None:
        for family in (page or {}).values():
            if family.kind not in MONOTONE:
                continue
            self.families.setdefault(family.name, Family(family.name, family.kind, family.help))
            for name, labels, value in family.samples:
                count = self.counted.setdefault((replica, family.name, name, labels), [0.0, 0.0])
                if value < count[1]:
                    count[0] += count[1]
                count[1] = value

    def totals(self) -> dict[str, dict[tuple, float]]:
        sums: dict[str, dict[tuple, float]] = {}
        for (_, family, name, labels), (before, last) in self.counted.items():
            totals = sums.setdefault(family, {})
            totals[(name, labels)] = totals.get((name, labels), 0.0) + before + last
        return sums


def aggregate(pages: list[dict[str, Family] | None], counts: Counts | None = None) -> list[Family]:
    """One family per name over every replica's page (None: a replica that did not answer): counters,
    histograms and summaries summed per (sample, labels), anything else kept per replica. With `counts` (kept
    from one scrape to the next) counters and histograms never go down: a replica down counts what it last
    said, a replica restarted what it had counted before too."""
    counts = counts or Counts()
    merged: dict[str, Family] = {}
    sums: dict[str, dict] = {}
    for replica, page in enumerate(pages):
        counts.update(replica, page)
        for family in (page or {}).values():
            out = merged.setdefault(family.name, Family(family.name, family.kind, family.help))
            if family.kind in MONOTONE:
                continue
            if family.kind in SUMMED:
                totals = sums.setdefault(family.name, {})
                for name, labels, value in family.samples:
                    key = (name, labels)
                    totals[key] = totals.get(key, 0.0) + value
            else:
                out.samples += [(name, labels + (("replica", str(replica)),), value)
                                for name, labels, value in family.samples]
    for name, totals in counts.totals().items():
        known = counts.families[name]
        merged.setdefault(name, Family(name, known.kind, known.help))
        sums[name] = totals
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
