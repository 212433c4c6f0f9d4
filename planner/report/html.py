"""One self-contained `report.html` per run, sweep or capacity search: viewable offline.

Plots are embedded as base64 PNG (data: URLs), styles inline, no script or
font from the network. A few lines of inline script only mark, once the page
has loaded, whether every image decoded (`<body data-images="ok N">`), so a
headless browser can check the report really shows.
"""
from __future__ import annotations

import base64
import html
import math
from pathlib import Path

from planner.deploy.parallel import layout_suffix

# Metric definitions (DESIGN.md), shown beside the numbers.
DEFINITIONS = {
    "request_throughput": "completed requests / (last finish - first arrival); steady: completions in the window / its length",
    "request_goodput": "(with SLOs) requests within every SLO's per-request limit / the same span, as vLLM bench's "
                       "--goodput counts them",
    "output_token_throughput": "generated tokens / the same span; steady: tokens generated in the window / its length",
    "normalized_latency": "mean over requests of end-to-end latency / output tokens of one sequence (s/token)",
    "ttft_mean": "time to first token: first token - arrival, mean", "ttft_p99": "time to first token, 99th percentile",
    "tpot_mean": "time per output token: (finish - first token) / (output tokens of one sequence - 1), mean",
    "tpot_p99": "time per output token, 99th percentile",
    "e2e_mean": "end-to-end latency: finish - arrival, mean", "e2e_p99": "end-to-end latency, 99th percentile",
    "mean_batch_size": "mean number of requests in a decode step, over decode steps (the paper's batched requests)",
    "kv_utilization": "KV slots holding a token / all KV slots, time-averaged",
    "kv_full_share": "share of the time with fewer than 5% of KV slots free",
}
UNITS = {"request_throughput": "req/s", "request_goodput": "req/s", "output_token_throughput": "tok/s", "normalized_latency": "s/token",
         "ttft_mean": "s", "ttft_p99": "s", "tpot_mean": "s", "tpot_p99": "s", "e2e_mean": "s", "e2e_p99": "s",
         "mean_batch_size": "", "kv_utilization": "", "kv_full_share": ""}

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}
td:first-child,th:first-child{text-align:left}td.def{text-align:left;color:#555;font-size:.9em}
.verdict{background:#f5f8ff;border-left:5px solid #36c;padding:.6em 1em}
.verdict.bad{background:#fff5f3;border-left-color:#c33}
.warn{background:#fffbe6;border-left:5px solid #d90;padding:.4em 1em}
img{max-width:100%;display:block;margin:.6em 0}code{background:#f2f2f2;padding:0 .2em}
tr.best td{background:#eaf7ea;font-weight:600}
"""

_IMAGE_CHECK = """<script>
window.addEventListener('load', function () {
  var imgs = document.images, ok = 0;
  for (var i = 0; i < imgs.length; i++) { if (imgs[i].complete && imgs[i].naturalWidth > 0) ok++; }
  document.body.setAttribute('data-images', (ok === imgs.length ? 'ok ' : 'broken ') + ok + '/' + imgs.length);
});
</script>"""


def esc(value) -> str:
    return html.escape(str(value))


def fmt(value, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.{digits}g}" if abs(value) < 1e5 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def image(path: Path, alt: str) -> str:
    """An <img> with the PNG at `path` embedded as a data: URL."""
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{data}">'


def table(header: list[str], rows: list[list], classes: list[str] | None = None) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        cells = "".join(c if isinstance(c, str) and c.startswith("<td") else f"<td>{esc(c)}</td>" for c in row)
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def verdict_box(lines: list[str], bad: bool = False) -> str:
    items = "".join(f"<li>{esc(line)}</li>" for line in lines)
    return f'<div class="verdict{" bad" if bad else ""}" id="verdict"><strong>Verdict</strong><ul>{items}</ul></div>'


def bullet_list(items: list[str], cls: str = "") -> str:
    if not items:
        return ""
    inner = "".join(f"<li>{esc(i)}</li>" for i in items)
    return f'<div class="{cls}"><ul>{inner}</ul></div>' if cls else f"<ul>{inner}</ul>"


def page(title: str, body: list[str]) -> str:
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{esc(title)}</title><style>{_STYLE}</style></head><body>"
            f"<h1>{esc(title)}</h1>{''.join(body)}{_IMAGE_CHECK}</body></html>\n")


def memory_plan_table(plan: dict | None, metrics: dict) -> str:
    if plan is None:
        return table(["item", "value"], [["KV blocks (given)", fmt(metrics.get("num_gpu_blocks"))]])
    tp = plan["tp"]
    share = plan.get("kv_head_share", tp)  # a token's KV split over share GPUs (MLA's latent: whole on each)
    gpus = tp * plan.get("pp", 1)          # pipeline stages: each GPU holds its stage's share
    rows = [["usable memory", f"{plan['usable_gib_per_gpu']:.2f} GiB", f"{plan['usable_gib_per_gpu'] * gpus:.2f} GiB"],
            ["weights", f"{plan['weights_gib_per_gpu']:.2f} GiB", f"{plan['weights_gib_per_gpu'] * gpus:.2f} GiB"],
            ["activations (peak)", f"{plan['activations_gib_per_gpu']:.2f} GiB",
             f"{plan['activations_gib_per_gpu'] * gpus:.2f} GiB"],
            *([["non-torch (CUDA, cuBLAS, NCCL)", f"{plan['non_torch_gib_per_gpu']:.2f} GiB",
                f"{plan['non_torch_gib_per_gpu'] * gpus:.2f} GiB"]] if "non_torch_gib_per_gpu" in plan else []),
            ["KV cache", f"{plan['kv_gib_per_gpu']:.2f} GiB", f"{plan['kv_gib_total']:.2f} GiB"],
            ["KV blocks x block size", f"{plan['num_gpu_blocks']:,} x {plan['block_size']}",
             "same block ids on every GPU"],
            ["KV token slots", f"{plan['kv_token_slots']:,} (1/{share} of the heads each)" if share > 1
             else f"{plan['kv_token_slots']:,}", f"{plan['kv_token_slots']:,}"],
            ["CPU swap blocks", f"{plan['num_cpu_blocks']:,}", ""]]
    stages = layout_suffix(plan.get("pp"), plan.get("dp")) + (" (the largest stage's)" if plan.get("pp", 1) > 1
                                                               else "")
    caption = (f"<p>{esc(plan['model'])} on {tp} x {esc(plan['gpu'])}{stages}, gpu_memory_utilization "
               f"{plan['gpu_memory_utilization']:.0%}</p>")
    if gpus == 1:
        return caption + table(["item", "per GPU"], [r[:2] for r in rows])
    each = "each dp rank's" if plan.get("dp", 1) > 1 else "all"
    return caption + table(["item", "per GPU", f"{each} {gpus} GPUs"], rows)


def metrics_table(doc: dict) -> str:
    steady = doc.get("steady_state") or {}
    rows = []
    for key, definition in DEFINITIONS.items():
        if key == "request_goodput" and key not in doc:      # a run without SLOs has none
            continue
        whole = doc.get(key) if key != "kv_full_share" else None
        unit = UNITS.get(key, "")
        rows.append([key, f"{fmt(whole)} {unit}".strip(), f"{fmt(steady.get(key))} {unit}".strip(),
                     f'<td class="def">{esc(definition)}</td>'])
    window = steady.get("window")
    note = ""
    if window:
        note = (f"<p>Steady window: {window['start']:.1f} s to {window['end']:.1f} s of simulated time "
                f"(warm-up: {esc(window['warmup'])}; drain: {esc(window['drain'])}).</p>")
    else:
        note = "<p>No steady window (too few requests, or all arrived at once): whole-run figures only.</p>"
    return note + table(["metric", "whole run", "steady state", "definition"], rows)


def rejected_section(verdict: dict) -> str:
    rejected = verdict.get("rejected") or []
    parts = [f"<p>{fmt(verdict.get('num_rejected', 0))} rejected, {fmt(verdict.get('num_truncated', 0))} "
             f"truncated (ended early: the sequence outgrew the whole KV cache or reached the context limit).</p>"]
    if rejected:
        parts.append(table(["reason", "requests", "example"],
                           [[r["reason"], r["count"], r["example_request"]] for r in rejected]))
    return "".join(parts)


# The per-replica table of a fleet's report: result.json's fleet.per_replica columns and their headings.
REPLICA_COLUMNS = {"replica": "replica", "num_requests": "requests", "request_share": "share",
                   "request_throughput": "req/s", "ttft_mean": "TTFT mean s", "ttft_p99": "TTFT p99 s",
                   "tpot_mean": "TPOT mean s", "e2e_mean": "E2E mean s", "mean_batch_size": "batch",
                   "kv_utilization": "KV util", "prefix_cache_hit_rate": "prefix hits", "busy_time": "busy s",
                   "preemptions": "preempted"}


def fleet_section(fleet: dict) -> list[str]:
    """A fleet's replicas side by side, and how unevenly the router spread the load."""
    rows = [[fmt(r.get(c)) for c in REPLICA_COLUMNS] for r in fleet["per_replica"]]
    imbalance = ", ".join(f"{k.replace('_', ' ')} {fmt(v, 3)}" for k, v in fleet["load_imbalance"].items())
    return [f"<h2>Replicas ({fleet['replicas']}, router {esc(fleet['router'])})</h2>",
            f"<p>Load imbalance (max / mean over replicas; 1 is even): {esc(imbalance)}. The metrics above are "
            f"the whole fleet's; the memory plan is one replica's.</p>",
            table(list(REPLICA_COLUMNS.values()), rows)]


def spec_section(stats: dict) -> list[str]:
    """Speculative decoding's counters (vLLM's names) and the curve they were drawn from."""
    per_pos = stats.get("acceptance_rate_per_pos") or []
    rows = [["method", f"{stats.get('method')}, k = {stats.get('num_speculative_tokens')}"],
            ["acceptance curve (conditional, per position)",
             f"{', '.join(f'{p:g}' for p in stats.get('acceptance', []))} ({stats.get('acceptance_source')})"],
            ["num_drafts", fmt(stats.get("num_drafts"))], ["num_draft_tokens", fmt(stats.get("num_draft_tokens"))],
            ["num_accepted_tokens", fmt(stats.get("num_accepted_tokens"))],
            ["acceptance rate", fmt(stats.get("acceptance_rate"), 3)],
            ["acceptance rate per position", ", ".join(fmt(p, 3) for p in per_pos)],
            ["mean acceptance length", f"{fmt(stats.get('mean_acceptance_length'), 3)} (the curve's expectation: "
                                       f"{fmt(stats.get('expected_mean_acceptance_length'), 3)})"],
            ["proposer time in the steps", f"{fmt(stats.get('proposer_seconds'), 3)} s"]]
    return ["<h2>Speculative decoding</h2>", table(["", ""], rows)]


def run_report(doc: dict, plots: dict[str, Path], title: str) -> str:
    """The HTML of one simulated run (its result document and its PNG plots)."""
    v = doc.get("verdict", {})
    bad = v.get("state") in ("overloaded", "saturated") or v.get("bound") == "rejections"
    body = [verdict_box(v.get("lines", []), bad=bad)]
    if doc.get("warnings"):
        body += ["<h2>Warnings</h2>", bullet_list(doc["warnings"], "warn")]
    body += ["<h2>Memory plan</h2>", memory_plan_table(doc.get("memory_plan"), doc),
             "<h2>Metrics</h2>", metrics_table(doc), *(fleet_section(doc["fleet"]) if doc.get("fleet") else []),
             *(spec_section(doc["spec_decoding_stats"]) if doc.get("spec_decoding_stats") else []),
             f"<p>Preemptions: {esc(doc.get('preemptions'))}. Cost model: <code>{esc(doc.get('cost_model'))}"
             f"</code>.</p>", "<h2>Rejected and truncated requests</h2>", rejected_section(v)]
    for key, caption in (("timeline", "Queue, batch and KV cache over time"), ("latency_cdf", "Latency CDFs"),
                         ("memory_breakdown", "KV-cache memory breakdown")):
        if key in plots:
            body += [f"<h2>{esc(caption)}</h2>", image(plots[key], caption)]
    if v.get("next_commands"):
        body += ["<h2>Next commands</h2>",
                 bullet_list([f"{c['command']}   ({c['why']})" for c in v["next_commands"]])]
    body += ["<h2>What the cost model does not capture</h2>", bullet_list(doc.get("not_modelled", [])),
             f"<p>Command: <code>{esc(doc.get('command', ''))}</code></p>"]
    return page(title, body)


def sweep_report(runs: list[dict], verdict: dict, plots: dict[str, Path], title: str,
                 columns: dict[str, str], rows: list[dict]) -> str:
    body = [verdict_box(verdict["lines"], bad=verdict.get("best_index") is None),
            f"<p>Best choice rule: {esc(verdict['best_rule'])}.</p>"]
    classes = ["best" if i == verdict.get("best_index") else "" for i in range(len(rows))]
    body += ["<h2>Runs</h2>", table(list(columns.values()) + ["verdict"],
                                    [[fmt(r.get(c)) for c in columns] + [
                                        run.get("verdict", {}).get("state", "?")]
                                     for r, run in zip(rows, runs)], classes)]
    warnings = sorted({w for run in runs for w in run.get("warnings", [])})
    if warnings:
        body += ["<h2>Warnings</h2>", bullet_list(warnings, "warn")]
    for key, path in plots.items():
        body += [f"<h2>{esc(key.replace('_', ' '))}</h2>", image(path, key)]
    if runs and runs[0].get("memory_plan"):
        body += ["<h2>Memory plan (first run)</h2>", memory_plan_table(runs[0]["memory_plan"], runs[0])]
    notes = sorted({n for run in runs for n in run.get("not_modelled", [])})
    body += ["<h2>Metric definitions</h2>", bullet_list([f"{k}: {d}" for k, d in DEFINITIONS.items()]),
             "<h2>What the cost model does not capture</h2>", bullet_list(notes)]
    return page(title, body)


def capacity_report(doc: dict, plots: dict[str, Path], title: str) -> str:
    at = doc.get("at_capacity") or {}
    clients = doc.get("capacity_concurrency") is not None or any("concurrency" in p for p in doc["probes"])
    x, label = ("concurrency", "clients") if clients else ("rate", "rate (req/s)")
    body = [verdict_box(doc.get("verdict", {}).get("lines", []), bad=doc.get(f"capacity_{x}") is None)]
    body += ["<h2>Probes</h2>", "<p>A probe meets the SLOs when every limit holds, nothing is rejected and "
             "requests do not keep piling up (state not overloaded). A probe whose steady window was shorter than "
             "8 latencies of its warm-up's requests ran again on a longer trace (its requests).</p>",
             table([label, "meets", *doc["slos"], "rejected", "state", "requests"],
                   [[fmt(p[x]), fmt(p["meets"]), *[fmt(p.get(k)) for k in doc["slos"]],
                     fmt(p.get("num_rejected")), fmt(p.get("state")), fmt(p.get("requests"))]
                    for p in doc["probes"]])]
    for key, path in plots.items():
        body += [f"<h2>{esc(key.replace('_', ' '))}</h2>", image(path, key)]
    if at:
        body += ["<h2>At capacity</h2>", metrics_table(at), "<h2>Memory plan</h2>",
                 memory_plan_table(at.get("memory_plan"), at)]
        body += ["<h2>What the cost model does not capture</h2>", bullet_list(at.get("not_modelled", []))]
    return page(title, body)
