"""The validation report: comparison.json, Markdown, the verdict and PNG plots of simulated against measured
(report.html: planner/validation/page.py)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from planner.analysis.verdict import analyse_run  # noqa: E402
from planner.deploy.plan import resolved  # noqa: E402
from planner.documents import SCHEMA_VERSION, json_safe  # noqa: E402
from planner.report.plots import legend  # noqa: E402
from planner.validation.compare import Validation  # noqa: E402
from planner.validation.page import validation_page  # noqa: E402

# What the project aims for (issue 6); shown next to the errors.
TARGETS = {"request_throughput": 0.05, "e2e_mean": 0.10, "step_time_median": 0.10}


def _finite(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def as_json(v: Validation) -> dict:
    """comparison.json: the settings, every metric measured and simulated, the verdict, where errors come from."""
    s, d = v.spec, v.spec.deployment
    return {
        "schema_version": SCHEMA_VERSION, "model": v.model.name, "gpu": d.gpu, "workload": s.workload,
        "workload_params": dict(s.params),
        "rate": s.request_rate, "burstiness": s.burstiness, "concurrency": s.concurrency, "requests": s.requests,
        "ramp_up": s.ramp_up.record() if s.ramp_up else None,
        "seed": s.seed, "length_scale": s.length_scale,
        "block_size": d.block_size, "preemption_mode": d.preemption_mode, "deployment": _deployment_run(v),
        "num_gpu_blocks": v.live.num_gpu_blocks, "kernels": v.live.kernels, "cost_model": v.cost_model,
        "comparison": {k: {kk: _finite(vv) for kk, vv in row.items()} for k, row in v.comparison().items()},
        "per_step_error": v.step_error_summary(),
        "preemptions": {"measured": v.live.metrics.get("preemptions"),
                        "simulated": v.simulated.get("preemptions")},
        **{key: {"measured": v.live.metrics.get(key), "simulated": v.simulated.get(key)}
           for key in ("num_completed", "num_rejected", "num_truncated")},
        "error_attribution": v.attribution,
        "profile_check": v.profile_check,
        "speed_level": None if v.speed_level is None else
        {**v.speed_level.as_dict(), "errors_without_correction": v.uncorrected_errors()},
        "speed_timeline": None if v.speed_timeline is None else
        {**v.speed_timeline.as_dict(), "errors_without_correction": v.uncorrected_errors()},
        "simulated_spread": None if v.spread is None else v.spread.as_dict(),
        "warnings": v.warnings,
        "verdict": validation_verdict(v),
        **({} if v.live.spec_decoding is None else {"spec_decoding": spec_comparison(v)}),
        **({} if v.live.kv_offload is None else
           {"kv_offload": {"measured": v.live.kv_offload, "simulated": v.simulated.get("kv_offload")}}),
    }


def spec_comparison(v: Validation) -> dict:
    """validate --speculative: the live engine's acceptance counters beside the simulation's (vLLM's names)."""
    live, sim = v.live.spec_decoding, v.simulated.get("spec_decoding_stats") or {}
    al_live, al_sim = live.get("mean_acceptance_length"), sim.get("mean_acceptance_length")
    return {"measured": live, "simulated": sim, "acceptance_curve": sim.get("acceptance"),
            "mean_acceptance_length_error": (al_sim / al_live - 1) if al_live and al_sim else None}


def load_text(spec) -> str:
    """How the trace's requests were sent: "at R req/s (Poisson)" (or gamma with a burstiness), "from N
    closed-loop clients", or "at R req/s (Poisson), at most N in flight"."""
    if spec.concurrency is not None and not spec.paced:
        return f"from {spec.concurrency} closed-loop clients"
    process = "Poisson" if spec.burstiness == 1 else f"gamma, burstiness {spec.burstiness:g}"
    limit = f", at most {spec.concurrency} in flight" if spec.paced else ""
    rate = f"by a {spec.ramp_up.describe()}" if spec.ramp_up else f"at {spec.arrival_rate:g} req/s"
    return f"{rate} ({process}){limit}"


def warning_lines(warnings: list[str]) -> list[str]:
    """A report's warnings (what the trace does on the deployment), one bullet each; none: nothing."""
    return ["", "Warnings:", *(f"- {w}" for w in warnings)] if warnings else []


def _fmt(x) -> str:
    if x is None:
        return "–"
    return f"{x:.4g}"


def _deployment_run(v: Validation) -> dict:
    """The deployment as the live engine ran it: the policy's defaults it resolved for its device."""
    limits = {"max_num_seqs": v.live.max_num_seqs, "enable_prefix_caching": v.live.enable_prefix_caching}
    return resolved(v.spec.deployment).replace(**{k: x for k, x in limits.items() if x is not None}).as_dict()


def as_markdown(v: Validation, plots: list[str]) -> str:
    c, d = v.spec, v.spec.deployment
    trace = (f"the recorded run {c.workload}: {c.requests} requests sent at their recorded times, lengths as "
             f"recorded" if c.recording else
             f"{c.requests} requests {load_text(c)}, seed {c.seed}, lengths x{c.length_scale} "
             f"(prompt <= {c.max_prompt_len}, output <= {c.max_output_len})")
    lines = [f"# Validation: {v.model.name} on {d.gpu}, workload {c.workload}", "", f"- trace: {trace}",
             f"- engine: {d.policy} policy, block size {d.block_size}, {v.live.num_gpu_blocks} KV blocks, max "
             f"{v.live.max_num_seqs or d.max_num_seqs} seqs, preemption by {d.preemption_mode}, "
             f"kernels `{v.live.kernels}`",
             f"- simulator cost model: `{v.cost_model}`", "",
             "| metric | measured | simulated | relative error | simulated 90% interval | measured in it | target |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, row in v.comparison().items():
        err = row["relative_error"]
        target = TARGETS.get(name)
        lines.append(f"| {name} | {_fmt(row['measured'])} | {_fmt(row['simulated'])} | "
                     f"{'–' if err is None else f'{err:+.1%}'} | {interval_text(row)} | {inside_text(row)} | "
                     f"{'' if target is None else f'±{target:.0%}'} |")
    lines += spread_lines(v)
    s = v.step_error_summary()
    if s:
        lines += ["", f"Per-step prediction (cost model applied to each measured step's shape): median |error| "
                      f"{s['median_abs']:.1%}, p90 |error| {s['p90_abs']:.1%}, mean error {s['mean']:+.1%} "
                      f"over {s['num_steps']} steps."]
    lines += _speed_level_lines(v) + _attribution_lines(v.attribution) + _profile_check_lines(v.profile_check)
    lines += warning_lines(v.warnings)
    lines += ["", *[f"![{p}]({p})" for p in plots], ""]
    return "\n".join(lines)


def interval_text(row: dict) -> str:
    """A comparison row's simulated 90% interval, 'low – high', or '–' without one."""
    if row.get("interval_low") is None:
        return "–"
    return f"{_fmt(row['interval_low'])} – {_fmt(row['interval_high'])}"


def inside_text(row: dict) -> str:
    """'yes', or how far outside the interval the nearest edge is (its error, as relative_error's sign), or '–'."""
    if row.get("inside_interval") is None:
        return "–"
    if row["inside_interval"]:
        return "yes"
    miss = row.get("interval_miss")
    return "no" if miss is None else f"no ({miss:+.1%})"


def spread_lines(v: Validation) -> list[str]:
    """What the interval is: how many noisy simulations, how long they took."""
    sp = v.spread
    if sp is None:
        return ["", "No simulated interval: " + ("--seeds 0." if v.spec.seeds == 0 else
                                                 f"the cost model ({v.cost_model}) carries no timing noise.")]
    return ["", f"Simulated 90% interval: 5th to 95th percentile over {len(sp.seeds)} simulations of the same "
                f"trace with the profile's timing noise (each step part scattered by its residual spread, "
                f"seeds {sp.seeds[0]}-{sp.seeds[-1]}), {sp.wall_s:.1f} s on {sp.workers} worker(s). "
                f"In it (sign as relative error): the nearest edge's error when the measurement is outside."]


def _share(part: dict) -> str:
    share = "–" if part["share"] is None else f"{part['share']:.0%}"
    return f"{part['error']:+.1%} ({share})"


def _attribution_lines(a: dict | None) -> list[str]:
    """Where the error comes from (planner/validation/attribution.py): each part as error and share of the total."""
    if not a:
        return []
    lines = ["", "## Where the error comes from", "",
             "The simulator re-run replaying the live step durations (replay), and those plus the host time "
             "between steps (replay + gaps): the total error = step-time model + scheduling divergence + "
             "between-step time. Each cell: error relative to measured (share of the total error).", "",
             "| metric | total error | (a) step-time model | (b) scheduling divergence | (c) between-step time, rest |",
             "|---|---:|---:|---:|---:|"]
    for name, row in a.items():
        if name in ("between_step_time", "steps") or row is None:
            continue
        lines.append(f"| {name} | {row['total_error']:+.1%} | {_share(row['step_time_model'])} | "
                     f"{_share(row['scheduling'])} | {_share(row['between_steps'])} |")
    gaps = a.get("between_step_time")
    if gaps:
        lines += ["", f"Host time between busy steps: {gaps['total_s']:.3g} s in all, {gaps['mean_s'] * 1e3:.3g} ms "
                      f"per step, {gaps['share_of_busy_time']:.1%} of the busy time (the simulator has none)."]
    return lines


def _speed_level_lines(v: Validation) -> list[str]:
    """The device's speed during the run, level or timeline (planner/profile/speed.py), and the errors without it."""
    if v.speed_level is None and v.speed_timeline is None:
        return []
    speed = v.speed_level or v.speed_timeline
    lines = ["", f"Speed: {speed.headline()}."]
    raw = v.uncorrected_errors()
    if raw:
        lines.append("Errors with the profile as it is: " + ", ".join(
            f"{name} {'–' if err is None else f'{err:+.1%}'}" for name, err in raw.items()) + ".")
    return lines


def _profile_check_lines(check: dict | None) -> list[str]:
    if not check:
        return []
    ratio = f", canary measured/profile {check['ratio']:.3f}" if check.get("ratio") is not None else ""
    return ["", f"Profile check: **{check['status']}**{ratio}: {check['reason']}"]


def _series(steps, attr):
    t0 = steps[0].start if steps else 0.0
    return [s.end - t0 for s in steps], [getattr(s, attr) for s in steps]


def _cdf(ax, values, label):
    xs = sorted(values)
    ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=label)


def plot(v: Validation, out: Path) -> list[str]:
    names = []
    fig, axes = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for steps, label in ((v.live.steps, "measured"), (v.sim_steps, "simulated")):
        t, b = _series(steps, "batch_size")
        axes[0].plot(t, b, label=label, lw=0.8)
        t, k = _series(steps, "kv_blocks_used")
        axes[1].plot(t, k, label=label, lw=0.8)
    axes[0].set_ylabel("batch size (requests)")
    axes[1].set_ylabel("KV blocks used")
    axes[1].set_xlabel("time (s)")
    legend(axes[0])
    fig.tight_layout()
    fig.savefig(out / "timeline.png", dpi=110)
    plt.close(fig)
    names.append("timeline.png")

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, metric in zip(axes, ("ttft", "tpot", "e2e")):
        for records, label in ((v.live.requests, "measured"), (v.sim_requests, "simulated")):
            done = [r for r in records if not r.rejected and r.finish is not None]
            values = [x for r in done if (x := getattr(r, metric)) is not None]
            if values:
                _cdf(ax, values, label)
        ax.set_xlabel(f"{metric} (s)")
        ax.set_ylabel("CDF")
        legend(ax)
    fig.tight_layout()
    fig.savefig(out / "latency_cdf.png", dpi=110)
    plt.close(fig)
    names.append("latency_cdf.png")

    if v.step_errors:
        fig, ax = plt.subplots(figsize=(6, 3.6))
        ax.hist([100 * e for e in v.step_errors], bins=40)
        ax.set_xlabel("per-step prediction error (%)")
        ax.set_ylabel("steps")
        fig.tight_layout()
        fig.savefig(out / "step_errors.png", dpi=110)
        plt.close(fig)
        names.append("step_errors.png")
    return names


def write_report(v: Validation, out: Path) -> tuple[dict[str, Path], dict]:
    """The report folder: comparison.json (with the verdict), report.md, report.html and the plots;
    returns the files by kind and comparison.json's document."""
    out.mkdir(parents=True, exist_ok=True)
    plots = plot(v, out)
    doc = json_safe(as_json(v))
    paths = {"comparison": out / "comparison.json", "markdown": out / "report.md"}
    paths["comparison"].write_text(json.dumps(doc, indent=2) + "\n")
    paths["markdown"].write_text(as_markdown(v, plots))
    d = v.spec.deployment
    paths["html"] = validation_page(doc, out, f"Validation: {v.model.name} on {d.gpu}, {v.spec.workload} "
                                              f"{load_text(v.spec)}")
    return paths, doc


def judge(validation: Validation, targets: dict[str, float] = TARGETS) -> dict[str, dict]:
    """Per target metric: its error, its target, whether the measurement is inside the simulated interval
    (and the interval's edges as errors, edge / measured - 1), and `pass`: within the target, or inside
    the interval (what the timing noise allows)."""
    rows = validation.comparison()
    judged = {}
    for name, target in targets.items():
        row = rows.get(name, {})
        err = row.get("relative_error")
        if err is None:
            continue
        inside, measured = row.get("inside_interval"), row.get("measured")
        edges = None
        if inside is not None and measured:
            edges = [row["interval_low"] / measured - 1, row["interval_high"] / measured - 1]
        judged[name] = {"relative_error": err, "target": target, "within_target": abs(err) <= target,
                        "inside_interval": inside, "interval_miss": row.get("interval_miss"),
                        "interval_errors": edges, "pass": abs(err) <= target or inside is True}
    return judged


def _judged_text(name: str, j: dict, level: float) -> str:
    """'e2e_mean -12.0% (target ±10%; the measurement inside the simulated 90% interval, errors -14.1% to
    +2.0%)': the interval's edges as errors against the measurement, so 'inside' means they straddle 0."""
    where = ""
    if j["inside_interval"] is not None:
        span = "" if j["interval_errors"] is None else \
            f", errors {j['interval_errors'][0]:+.1%} to {j['interval_errors'][1]:+.1%}"
        where = (f"; the measurement {'inside' if j['inside_interval'] else 'outside'} the simulated "
                 f"{level:.0%} interval{span}")
    return f"{name} {j['relative_error']:+.1%} (target ±{j['target']:.0%}{where})"


def validation_verdict(validation: Validation, targets: dict[str, float] = TARGETS) -> dict:
    """Is the simulator within its targets against the live engine (or inside the interval its timing noise
    allows), and how loaded was the live run."""
    judged = judge(validation, targets)
    level = validation.spread.level if validation.spread is not None else 0.9
    within = [_judged_text(n, j, level) for n, j in judged.items() if j["pass"]]
    missed = [_judged_text(n, j, level) for n, j in judged.items() if not j["pass"]]
    spec = validation.spec
    live = dict(validation.live.metrics)
    live["params"] = {"trace_params": {"rate": spec.request_rate, **(spec.ramp_up.record() if spec.ramp_up else {})},
                      "concurrency": spec.concurrency,
                      "max_num_seqs": validation.live.max_num_seqs or spec.deployment.max_num_seqs, "tp": 1}
    load = analyse_run(live, validation.live.requests, validation.live.steps)["verdict"]
    lines = [("Simulator within its targets or the simulated interval: " + ", ".join(within)) if not missed else
             ("Simulator off target and outside the simulated interval: " + ", ".join(missed)
              + (f"; within: {', '.join(within)}" if within else ""))]
    lines += [f"Live run: {line}" for line in load["lines"][:4]]
    d = spec.deployment
    lines.append("Next: " + (f"planner validate --gpu {d.gpu} --model {d.model} --workload {spec.workload} "
                             f"--reprofile  (recalibrate on this machine along the live run)" if missed else
                             f"planner simulate --gpu a100-40g --workload {spec.workload}  (the cost model held up "
                             f"here; plan on the hardware you would buy)"))
    return {"within_targets": not missed, "within": within, "missed": missed, "judged": judged,
            "interval_level": level if validation.spread is not None else None,
            "seeds": len(validation.spread.seeds) if validation.spread is not None else 0,
            "live": load, "lines": lines}
