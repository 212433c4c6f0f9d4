"""`planner profile --speculative ngram:K --workload TRACE`: n-gram speculation measured on a trace's text.

Prompt lookup's drafts and their acceptance depend on the text, not on the device: a draft is made
where the context's last n-gram occurred before, and (greedy) accepted while it equals the text that
follows. So they are measured on a trace that holds its answers' token ids (an imported ShareGPT
trace: `planner workload import`), replaying each answer through the engine's own proposer with its
caps (`engine.core.speculative.replay_ngram`). The result is the three curves the simulator draws
from (`--acceptance`, `--draft-rates`, `--draft-persistence`) with the counts behind them.
"""
from __future__ import annotations

from engine.core.speculative import SpecDecodingStats, SpeculativeConfig, replay_ngram
from engine.deployment import parse_speculative
from planner.errors import PlannerError
from workloads import Trace


def measure_ngram(trace: Trace, speculative: str, prompt_lookup_min: int | None = None,
                  prompt_lookup_max: int | None = None) -> SpecDecodingStats:
    """The proposer's counters over every answer of `trace` (one-line error without answers' ids)."""
    method, k = parse_speculative(speculative)
    if method != "ngram":
        raise PlannerError(f"--speculative {speculative}: a trace measures n-gram (prompt lookup) speculation "
                           f"only; {method} acceptance comes from its draft head (docs/speculative.md)")
    config = SpeculativeConfig("ngram", k, prompt_lookup_min, prompt_lookup_max)
    with_answers = [r for r in trace.requests if r.output_token_ids is not None and r.prompt_token_ids is not None]
    if not with_answers:
        raise PlannerError(f"trace {trace.name!r} holds no answers' token ids: measure n-gram speculation on an "
                           "imported trace (planner workload import FILE --format sharegpt --tokenizer DIR)")
    stats = SpecDecodingStats(k)
    for req in with_answers:
        replay_ngram(req.prompt_token_ids, req.output_token_ids, config, stats)
    return stats


def curve_flags(stats: SpecDecodingStats, speculative: str) -> list[str]:
    """The simulate flags that reproduce the measured speculation."""
    flags = ["--speculative", speculative]
    for name, value in stats.curves().items():
        flags += ["--" + name.replace("_", "-"), str(value)]
    return flags
