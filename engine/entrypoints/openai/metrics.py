"""/metrics: Prometheus text exposition with vLLM's metric names.

Gauges are read from the engine when scraped; counters and histograms are
updated as requests finish. Histograms use vLLM's bucket edges, so dashboards
built for vLLM read these unchanged.
"""
from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

from engine.core.metrics import RequestRecord

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                   120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


@dataclass
class Histogram:
    name: str
    help: str
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.total += value
        self.count += 1

    def render(self, labels: str) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        cumulative = 0
        for edge, n in zip(self.buckets, self.counts):
            cumulative += n
            lines.append(f'{self.name}_bucket{{{labels},le="{edge}"}} {cumulative}')
        lines.append(f'{self.name}_bucket{{{labels},le="+Inf"}} {self.count}')
        lines.append(f"{self.name}_sum{{{labels}}} {self.total}")
        lines.append(f"{self.name}_count{{{labels}}} {self.count}")
        return lines


def one_two_five(limit: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``limit``: vLLM's buckets for token counts (build_1_2_5_buckets)."""
    edges, power = [], 1
    while True:
        for m in (1, 2, 5):
            if m * power > limit:
                return tuple(edges)
            edges.append(m * power)
        power *= 10


FINISH_REASONS = ("stop", "length", "abort", "error")


class ServerStats:
    """Counters and histograms of finished requests: one count per request, by its finish reason
    (aborts and failures included, with the tokens they had), latencies over served ones."""

    def __init__(self, max_model_len: int = 1 << 20) -> None:
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: dict[str, int] = {}
        self.step_failures = 0
        self.http: dict[tuple[str, str, str], int] = {}     # (handler, method, "2xx") -> responses
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             TPOT_BUCKETS)
        # vLLM's older name for the same per-token gaps; kept for dashboards that still use it.
        self.tpot_legacy = Histogram("vllm:time_per_output_token_seconds",
                                     "Histogram of time per output token in seconds.", TPOT_BUCKETS)
        self.tpot = Histogram("vllm:request_time_per_output_token_seconds",
                              "Histogram of time_per_output_token_seconds per request.", TPOT_BUCKETS)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             LATENCY_BUCKETS)
        tokens = one_two_five(max_model_len)
        self.prompt_hist = Histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens)
        self.generation_hist = Histogram("vllm:request_generation_tokens", "Number of generation tokens processed.",
                                         tokens)

    def observe(self, record: RequestRecord, output) -> None:
        """A request the engine finished, aborted or failed (requests it refused are not counted). A request
        vllm-v1 ran as n child requests counts as n, as vLLM's output processor observes each child
        (vllm/v1/engine/output_processor.py, _update_stats_from_finished)."""
        if record.rejected:
            return
        if getattr(output, "child_metrics", None):
            for child, completion in zip(output.child_metrics, output.outputs):
                self._observe(child, completion.finish_reason or "stop")
            return
        self._observe(record, next((o.finish_reason for o in output.outputs if o.finish_reason), None) or "stop")

    def _observe(self, record: RequestRecord, reason: str) -> None:
        self.finished[reason] = self.finished.get(reason, 0) + 1
        prompt = record.prompt_len if record.first_scheduled is not None else 0
        self.prompt_tokens += prompt
        self.generation_tokens += record.output_len
        self.prompt_hist.observe(prompt)
        self.generation_hist.observe(record.output_len)
        if reason not in ("stop", "length") or record.first_token is None:
            return
        self.ttft.observe(record.ttft)
        for a, b in zip(record.token_times, record.token_times[1:]):
            self.itl.observe(b - a)
            self.tpot_legacy.observe(b - a)
        if (tpot := record.tpot) is not None:
            self.tpot.observe(tpot)
        self.e2e.observe(record.e2e)


def _gauge(name: str, help_: str, labels: str, value: float, kind: str = "gauge") -> list[str]:
    return [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{{{labels}}} {value}"]


def _prefix_cache_counters(sched, alloc, labels: str) -> list[str]:
    """vLLM v1's prefix-cache counters (vllm/v1/metrics/loggers.py), in prompt tokens of the lookups of
    requests scheduled from nothing (a preempted request's lookup again is not counted, as there); those of the
    CPU tier are vLLM's KV connector's (`external`). Only under the vllm-v1 policy with prefix caching on,
    which counts them."""
    if getattr(sched, "prefix_queried_tokens", None) is None or not alloc.enable_prefix_caching:
        return []
    lines = _gauge("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
                   labels, sched.prefix_queried_tokens, "counter")
    lines += _gauge("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
                    labels, sched.prefix_hit_tokens, "counter")
    if alloc.offload is not None:
        stats = alloc.offload.stats
        lines += _gauge("vllm:external_prefix_cache_queries_total", "External prefix cache queries from KV "
                        "connector cross-instance cache sharing, in terms of number of queried tokens.", labels,
                        stats.queried_tokens, "counter")
        lines += _gauge("vllm:external_prefix_cache_hits_total", "External prefix cache hits from KV connector "
                        "cross-instance cache sharing, in terms of number of cached tokens.", labels,
                        stats.hit_tokens, "counter")
    return lines


def _lora_info(sched, max_loras: int) -> list[str]:
    """vLLM's `vllm:lora_requests_info` (vllm/v1/metrics/loggers.py, with --enable-lora): the adapters the running
    and the waiting requests use, each comma-joined in the order the requests come, on a gauge set to the
    time (a LoRA-aware router, such as the Gateway API inference extension's, reads the labels)."""
    def names(groups) -> str:
        return ",".join(dict.fromkeys(g.lora_name for g in list(groups) if g.lora_id))
    labels = _label_text({"max_lora": max_loras, "waiting_lora_adapters": names(sched.waiting),
                          "running_lora_adapters": names(sched.running)})
    return _gauge("vllm:lora_requests_info", "Running stats on lora requests.", labels, time.time())


def _label_text(labels: dict[str, object]) -> str:
    def esc(v: object) -> str:
        return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")
    return ",".join(f'{k}="{esc(v)}"' for k, v in labels.items())


def _http_counts(counts: dict[tuple[str, str, str], int]) -> list[str]:
    lines = ["# HELP http_requests_total Total number of requests by method, status and handler.",
             "# TYPE http_requests_total counter"]
    for (handler, method, status), n in sorted(counts.items()):
        lines.append(f"http_requests_total{{{_label_text({'handler': handler, 'method': method, 'status': status})}}} {n}")
    return lines


def _spec_decode_counters(spec, labels: str) -> list[str]:
    """vLLM's speculative-decoding counters (vllm/v1/spec_decode/metrics.py): acceptance rate is
    accepted / draft tokens, mean acceptance length 1 + accepted / drafts, and the per-position
    rate accepted_per_pos / drafts."""
    lines = _gauge("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.", labels,
                   spec.num_drafts, "counter")
    lines += _gauge("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.", labels,
                    spec.num_draft_tokens, "counter")
    lines += _gauge("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.", labels,
                    spec.num_accepted_tokens, "counter")
    lines += ["# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.",
              "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter"]
    for pos, n in enumerate(spec.num_accepted_tokens_per_pos):
        lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{pos}"}} {n}')
    return lines


def render(engine, stats: ServerStats, model_name: str) -> str:
    """The whole /metrics page."""
    sched = engine.scheduler
    alloc = engine.allocator
    cfg = sched.config
    m = _label_text({"model_name": model_name})
    total_blocks = alloc.num_gpu_blocks
    # vLLM v1 counts neither its null block (held from the start) nor among the blocks to use (BlockPool.get_usage)
    null = 1 if getattr(sched, "null_block", None) is not None else 0
    usable = total_blocks - null
    usage = (alloc.num_used_blocks() - null) / usable if usable > 0 else 0.0
    lines: list[str] = []
    lines += _gauge("vllm:num_requests_running", "Number of requests in model execution batches.", m,
                    len(sched.running))
    lines += _gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", m,
                    len(sched.waiting))
    lines += _gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.", m, len(sched.swapped))
    lines += _gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", m, usage)
    lines += _gauge("vllm:num_preemptions_total", "Cumulative number of preemptions from the engine.", m,
                    sum(sched.preemptions.values()), "counter")
    lines += _prefix_cache_counters(sched, alloc, m)
    lines += _gauge("vllm:prompt_tokens_total", "Number of prefill tokens processed.", m,
                    stats.prompt_tokens, "counter")
    lines += _gauge("vllm:generation_tokens_total", "Number of generation tokens processed.", m,
                    stats.generation_tokens, "counter")
    lines += ["# HELP vllm:request_success_total Count of finished requests, by finish reason "
              "(aborted and failed ones included).", "# TYPE vllm:request_success_total counter"]
    for reason in sorted(set(stats.finished) | set(FINISH_REASONS)):
        lines.append(f'vllm:request_success_total{{{m},finished_reason="{reason}"}} {stats.finished.get(reason, 0)}')
    lines += _gauge("planner:engine_step_failures_total", "Engine steps that failed (their requests ended with "
                    "an error; the engine went on).", m, stats.step_failures, "counter")
    for hist in (stats.ttft, stats.itl, stats.tpot_legacy, stats.tpot, stats.e2e, stats.prompt_hist,
                 stats.generation_hist):
        lines += hist.render(m)
    lines += _http_counts(stats.http)
    if cfg.max_loras is not None:
        lines += _lora_info(sched, cfg.max_loras)
    spec = getattr(engine, "spec_decoding_stats", None)
    if spec is not None:   # vLLM's SpecDecodingProm counters (only when speculation is on, as there)
        lines += _spec_decode_counters(spec, m)
    # Deployment settings, read back by `planner validate --endpoint`. vLLM exports
    # its cache config the same way (labels on a gauge of value 1).
    cache = _label_text({"block_size": alloc.block_size, "num_gpu_blocks": total_blocks,
                         "num_cpu_blocks": alloc.num_cpu_blocks,
                         "enable_prefix_caching": getattr(alloc, "enable_prefix_caching", False)})
    lines += _gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig.", cache, 1)
    sched_labels = _label_text({"max_num_seqs": cfg.max_num_seqs,
                                "max_num_batched_tokens": cfg.max_num_batched_tokens,
                                "max_model_len": cfg.max_model_len, "preemption_mode": cfg.preemption_mode,
                                "policy": "vllm-v1" if cfg.vllm_v1 else "paper",
                                "enable_chunked_prefill": cfg.enable_chunked_prefill,
                                "scheduling_policy": cfg.scheduling_policy,
                                "long_prefill_token_threshold": cfg.long_prefill_token_threshold})
    lines += _gauge("planner:scheduler_config_info", "Scheduler settings of this paged-planner server.",
                    sched_labels, 1)
    import torch    # loaded already: the engine runs in this process
    lines += _gauge("planner:engine_threads", "Torch threads the engine computes with (a CPU profile of this "
                    "server is taken at this count).", m, torch.get_num_threads())
    return "\n".join(lines) + "\n"
