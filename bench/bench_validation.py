"""Simulator accuracy on this CPU: live engine vs simulator on the same traces (issue 6 targets).

Runs `planner validate` for a ShareGPT-like and an Alpaca-like workload at
rates that keep the engine busy, and once under memory pressure (a small KV
cache, so requests are preempted), all with the committed calibrated profile,
and prints the errors side by side. Targets: request throughput within 5%,
mean E2E latency within 10%, median per-step time within 10%.

    .venv/bin/python bench/bench_validation.py [--profile FILE] [--examples DIR]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.deployment import Deployment  # noqa: E402
from planner.validation.run import validate  # noqa: E402
from planner.validation.spec import ValidationSpec  # noqa: E402
from planner.validation.report import write_report  # noqa: E402

RUNS = {
    "sharegpt": dict(workload="sharegpt", rate=4.0, requests=64, length_scale=0.25, max_output_len=160),
    "alpaca": dict(workload="alpaca", rate=8.0, requests=96, length_scale=1.0, max_output_len=160),
    "sharegpt, 48 KV blocks (preemption)": dict(workload="sharegpt", rate=4.0, requests=48, length_scale=0.25,
                                                max_output_len=160),
}
KV_BLOCKS = {"sharegpt, 48 KV blocks (preemption)": 48}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="opt-125m")
    parser.add_argument("--profile", default=None)
    parser.add_argument("--examples", type=Path, default=None, help="also write the reports here")
    parser.add_argument("--only", default=None, help="run only the runs whose name starts with this")
    parser.add_argument("--reprofile", action="store_true",
                        help="profile this CPU (--quick) along each live run, as `planner validate "
                             "--reprofile` does, and validate against that profile: separates the "
                             "simulator's error from drift of the machine since the committed profile "
                             "was measured")
    args = parser.parse_args()
    profiles = Path(tempfile.mkdtemp())
    header = f"{'run':<38}{'req/s err':>10}{'E2E mean err':>14}{'step median err':>17}" \
             f"{'median |step err|':>19}{'preemptions meas/sim':>22}"
    rows = []
    for name, settings in RUNS.items():
        if args.only and not name.startswith(args.only):
            continue
        deployment = Deployment(model=args.model, gpu="cpu", num_gpu_blocks=KV_BLOCKS.get(name))
        cfg = ValidationSpec(deployment, profile=args.profile, **settings)
        fresh = None
        if args.reprofile:
            from planner.profile.along import ProfileAlong
            fresh = ProfileAlong.quick("cpu", args.model, 16, profiles / f"{len(rows)}.json",
                                        cfg.trace().stats()["duration"], say=lambda line: print(line, file=sys.stderr))
        v = validate(cfg, fresh=fresh)
        c = v.comparison()
        steps = v.step_error_summary()
        rows.append(f"{name:<38}{c['request_throughput']['relative_error']:>+10.1%}"
                    f"{c['e2e_mean']['relative_error']:>+14.1%}{c['step_time_median']['relative_error']:>+17.1%}"
                    f"{steps['median_abs']:>19.1%}"
                    f"{int(c['preemptions']['measured'])!s:>15}/{int(c['preemptions']['simulated'])}")
        if args.examples:
            slug = name.split(",")[0] + ("-pressure" if "preemption" in name else "")
            print(f"report: {write_report(v, args.examples / slug)[0]['markdown']}", file=sys.stderr)
    which = "profiled along each run" if args.reprofile else args.profile or "committed"
    print(f"simulated vs measured, {args.model} on this CPU, profile {which} "
          f"(targets: req/s 5%, E2E 10%, step median 10%)")
    print(header)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
