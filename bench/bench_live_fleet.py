"""Live fleet against simulated fleet (issue 25, item 5): `planner validate --replicas 2 --gpu cpu` per policy.

For each router: 2 live opt-125m engines (random weights) stepping in turn on their own clocks
(planner/validation/fleet_live.py) and the simulated fleet on the same trace; prints fleet throughput,
mean E2E, mean TTFT, the prefix-cache hit rate and each replica's share of the requests, live and
simulated, against the targets (5%, 10%, 5 percentage points, 10%). With `--prefix N` the workload is
`prefix` with N shared prefixes (prefix caching on) and the study compares prefix-aware with round-robin:
the hit-rate gain and the TTFT gain (round-robin's mean TTFT / prefix-aware's), live and simulated; its
two live fleets are replayed side by side (run_live_fleets: the one furthest behind on the trace clock
takes the next event), so a drift of the machine's speed slows both alike instead of one run.

Every run is priced by one profile (`--profile`, e.g. one `planner profile --gpu cpu --quick` just took),
scaled by the canaries timed on the live engine right before and after each run (the machine's speed at
that moment: the shared 2-core machine here drifts by tens of percent between minutes), so each policy
is compared under the contention it ran in.

    .venv/bin/python bench/bench_live_fleet.py --profile P.json [--router round-robin,least-requests,least-kv]
    .venv/bin/python bench/bench_live_fleet.py --profile P.json --prefix 16 [--prefix-len 64] [--kv-cache-mb 150]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.core.routing import parse_policy
from engine.deployment import Deployment
from planner.profile.checkpoints import model_folder
from planner.validation.fleet import validate_fleet, validate_fleets, write_fleet_report
from planner.validation.run import load_cost_model
from planner.validation.spec import ValidationSpec
from workloads import make_trace


def prefix_trace(count: int, prefixes: int, prefix_len: int, seed: int) -> str:
    """The `prefix` workload with `prefixes` shared prefixes, as a trace file validate can take."""
    trace = make_trace("prefix", num_requests=count, rate=1.0, num_prefixes=prefixes, prefix_len=prefix_len,
                       seed=seed)
    path = os.path.join(tempfile.mkdtemp(prefix="fleet-prefix-"), f"prefix-{prefixes}x{prefix_len}.jsonl")
    trace.save(path)
    return path


def run(spec: ValidationSpec, routers: list[str], replicas: int, profile: str, out: str | None,
        together: bool) -> dict:
    """Each router's validation (`together`: their live fleets replayed side by side); printed."""
    _, model = model_folder(spec.deployment.model)
    cost = load_cost_model(spec, model, profile)
    started = time.perf_counter()
    if together:
        results = validate_fleets(spec, replicas, [parse_policy(r) for r in routers], cost_model=cost)
    else:
        results = [validate_fleet(spec, replicas, parse_policy(r), cost_model=cost) for r in routers]
    print(f"{len(routers)} live fleets{' together' if together else ''}: {time.perf_counter() - started:.0f} s")
    docs = {}
    for router, result in zip(routers, results):
        docs[router] = doc = result.document()
        if out:
            write_fleet_report(result, Path(out) / router.replace(":", "_"))
        show(router, doc)
    return docs


def show(router: str, doc: dict) -> None:
    print(f"\n{router}: {doc['speed']}")
    for name, row in doc["metrics"].items():
        err = "" if row["relative_error"] is None else f"{row['relative_error']:+.1%}"
        judged = "" if row["within"] is None else f" (target {row['target']:.0%}: {'ok' if row['within'] else 'MISSED'})"
        raw = (doc["simulated_without_speed_level"] or {}).get(name)
        unscaled = "" if raw is None or not row["measured"] else f"; at the profile's speed {raw / row['measured'] - 1:+.1%}"
        print(f"  {name:24s} live {_n(row['measured'])}  sim {_n(row['simulated'])}  {err}{judged}{unscaled}")
    for row in doc["split"]:
        print(f"  replica {row['replica']}: live {row['live_share']:.1%}  sim {row['simulated_share']:.1%}  "
              f"{row['difference_pp']:+.1f} pp ({'ok' if row['within'] else 'MISSED'})")


def _n(value) -> str:
    return "–" if value is None else f"{value:.4g}"


def prefix_study(docs: dict) -> None:
    """Prefix-aware against round-robin: hit-rate gain and TTFT gain, live and simulated."""
    rr, pa = docs["round-robin"]["metrics"], docs["prefix-aware"]["metrics"]
    print("\nprefix-aware vs round-robin")
    for side in ("measured", "simulated"):
        hit = pa["prefix_cache_hit_rate"][side] - rr["prefix_cache_hit_rate"][side]
        ttft = rr["ttft_mean"][side] / pa["ttft_mean"][side]
        print(f"  {'live' if side == 'measured' else 'sim '}: hit rate {rr['prefix_cache_hit_rate'][side]:.3f} -> "
              f"{pa['prefix_cache_hit_rate'][side]:.3f} (+{hit:.3f}), TTFT mean {rr['ttft_mean'][side] * 1e3:.1f} -> "
              f"{pa['ttft_mean'][side] * 1e3:.1f} ms (gain x{ttft:.3f})")
    live_gain = rr["ttft_mean"]["measured"] / pa["ttft_mean"]["measured"]
    sim_gain = rr["ttft_mean"]["simulated"] / pa["ttft_mean"]["simulated"]
    live_hit = pa["prefix_cache_hit_rate"]["measured"] - rr["prefix_cache_hit_rate"]["measured"]
    sim_hit = pa["prefix_cache_hit_rate"]["simulated"] - rr["prefix_cache_hit_rate"]["simulated"]
    print(f"  TTFT gain: sim / live - 1 = {sim_gain / live_gain - 1:+.1%} (target 10%); hit-rate gain: sim / live "
          f"- 1 = {(sim_hit / live_hit - 1) if live_hit else float('nan'):+.1%} (target 10%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", required=True, help="the calibrated profile that prices every run")
    parser.add_argument("--model", default="opt-125m")
    parser.add_argument("--router", default="round-robin,least-requests,least-kv")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--requests", type=int, default=56)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--length-scale", type=float, default=0.08)
    parser.add_argument("--max-output-len", type=int, default=64)
    parser.add_argument("--prefix", type=int, default=0, help="N prefixes: the prefix study")
    parser.add_argument("--prefix-len", type=int, default=64)
    parser.add_argument("--kv-cache-mb", type=float, default=None,
                        help="each live engine's KV cache (default 1 GiB): small, so a replica cannot hold every prefix")
    parser.add_argument("--together", action="store_true",
                        help="replay the routers' live fleets side by side (the prefix study always does)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write each run's fleet.json and report.md under this folder")
    args = parser.parse_args()
    spec = ValidationSpec(Deployment(model=args.model, gpu="cpu", enable_prefix_caching=args.prefix > 0),
                          requests=args.requests, rate=args.rate, length_scale=args.length_scale,
                          max_output_len=args.max_output_len, seed=args.seed, seeds=0, speed_correction=True,
                          **({"kv_cache_memory_bytes": int(args.kv_cache_mb * 2 ** 20)} if args.kv_cache_mb else {}))
    routers = args.router.split(",")
    if args.prefix:
        # Prompts keep their prefix at full length (length scale 1, the prefix workload's own lengths are short).
        spec = replace(spec, workload=prefix_trace(args.requests, args.prefix, args.prefix_len, args.seed),
                       length_scale=1.0)
        routers = ["round-robin", "prefix-aware"]
    docs = run(spec, routers, args.replicas, args.profile, args.out, together=args.prefix > 0 or args.together)
    if args.prefix:
        prefix_study(docs)


if __name__ == "__main__":
    main()
