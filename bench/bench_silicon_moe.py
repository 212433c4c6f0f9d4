"""MoE step prices against NVIDIA's measured end-to-end vLLM runs of gpt-oss-120b and MiniMax-M2.5 on H100: per run,
TPOT and TTFT.

Data. aiconfigurator-core 0.12.0 (Apache-2.0) ships NVIDIA's measured vLLM runs in
systems/silicon_sample.csv. bench/data/silicon_h100_vllm_moe.json holds the rows this bench uses,
with their source record: system h100_sxm (tested first, so no other GPU's row is read or kept, as
bench/bench_silicon_h100.py does for the dense runs), backend vllm, aggregated serving, MoE models
the catalog has: openai/gpt-oss-120b, its MXFP4 checkpoint (69 runs: vLLM 0.11.2 and 0.18.0, ISL/OSL
1024/1024, 1024/8192, 8192/1024, 4-512 concurrent clients, TP 2/4/8, moe_tp = TP, no DP or EP), and
MiniMaxAI/MiniMax-M2.5, its block-FP8 checkpoint (30 runs: vLLM 0.18.0, the same lengths, 4-64 clients,
TP 4 with expert parallelism). `--extract WHEEL` rebuilds the file from the wheel.

Each run is simulated as it was made (closed loop of C clients; the lightest runs first, each printed
as it ends): `planner simulate --model MODEL --gpu h100-sxm --tp N [--enable-expert-parallel] --policy vllm-v1
--workload random -p input_len=ISL -p output_len=OSL --concurrency C` with the run's recipe
(bench/silicon_recipes.py). The vLLM 0.18.0 gpt-oss runs are InferenceX's gpt-oss-120b H100 sweep (its grid,
its image and the week it ran): no prefix caching, max_num_seqs = C, max_model_len 10240, lengths
uniform on [0.8 L, L], R = 10 x C. The MiniMax-M2.5 runs are InferenceX's sweep of the same days
(silicon_recipes.INFERENCEX_MINIMAX: TP 4 with --enable-expert-parallel, max_num_seqs 256, the same
client). 15 of them come from a file that records them with attention_dp 4 and moe_ep 16 (batch size
C / 4), which one 8-GPU node cannot hold at TP 4 and which the recipe of those days does not have; their
ids say tp4_ep4, as the other 15's do, so all 30 are simulated as TP 4 with EP 4 at the C of their ids.
The gpt-oss runs no recipe covers (0.11.2 or unstated, 512 clients) record nothing more: vLLM's
API-server defaults on H100 (max_num_batched_tokens 8192, max_num_seqs 1024, prefix caching on),
max_model_len = ISL + OSL, fixed lengths, R = 4 x C (at least 32). Priced by the measured model (the
MoE from NVIDIA's fused-MoE table for the experts' kernel, uniform routing unless --moe-skew) and,
beside it, the roofline. Nothing is fitted here: the host constants are the ones fitted to the dense
H100 runs (docs/calibration.md).
Host time is charged in series (vLLM 0.12's loop, as calibrated) and, as a second column, hidden
behind the GPU (async scheduling, vLLM's default by 0.18): the two bracket what the runs can show. Every
column re-prices one schedule, the recipe's: under async scheduling a request joins the step after next.

    .venv/bin/python bench/bench_silicon_moe.py [--quick] [--model minimax] [--moe-skew S]
    .venv/bin/python bench/bench_silicon_moe.py --extract aiconfigurator_core-0.12.0-*.whl
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import sys
import time
import zipfile
from dataclasses import dataclass, replace

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from engine.deployment import Deployment  # noqa: E402
from planner.api import run_spec  # noqa: E402
from planner.cost.measured import MeasuredCostModel  # noqa: E402
from planner.cost.roofline import RooflineCostModel  # noqa: E402
from planner.deploy.plan import plan_deployment  # noqa: E402
from planner.runs.pipeline import Simulation  # noqa: E402
from silicon_recipes import INFERENCEX_GPTOSS, INFERENCEX_MINIMAX, VLLM_DEFAULTS, Recipe, Schedule  # noqa: E402

DATA_FILE = os.path.join(ROOT, "bench", "data", "silicon_h100_vllm_moe.json")
SILICON_CSV = "aiconfigurator_core/systems/silicon_sample.csv"
PACKAGE = "aiconfigurator-core 0.12.0 (Apache-2.0)"
MOE = ("openai/gpt-oss-120b", "MiniMaxAI/MiniMax-M2.5")     # the catalog's MoE models among the h100_sxm vLLM rows
# The runs no recipe covers: requests per concurrent client R = 4 x C, at least 32 (half the dense bench's 8,
# because they decode up to 8,192 tokens at 512 clients, which step by step takes minutes a run on two cores).
UNRECORDED = replace(VLLM_DEFAULTS, requests_per_client=4, min_requests=32)


@dataclass(frozen=True)
class Row:
    """One measured run: ISL, OSL, concurrent clients, TP (and EP), measured means (seconds), vLLM version."""

    model: str
    isl: int
    osl: int
    concurrency: int
    tp: int
    ttft: float
    tpot: float
    vllm: str
    expert_parallel: bool = False

    @property
    def label(self) -> str:
        split = f"tp{self.tp}" + (f" ep{self.tp}" if self.expert_parallel else "")
        return f"{self.model.split('/')[-1]} {self.isl}/{self.osl} c{self.concurrency} {split} (vLLM {self.vllm})"


def extract(wheel: str) -> dict:
    """The h100_sxm vLLM aggregated runs of the catalog's MoE models from the wheel (system filtered first)."""
    with zipfile.ZipFile(wheel) as z:
        raw = z.read(SILICON_CSV)
    out = []
    for r in csv.DictReader(io.StringIO(raw.decode("utf-8"))):
        if r["system"] != "h100_sxm":
            continue
        if r["backend"] != "vllm" or r["mode"] != "agg" or r["model_path"] not in MOE:
            continue
        out.append([r["model_path"], int(r["isl"]), int(r["osl"]), int(float(r["batch_size"])),
                    int(float(r["tp_size"])), float(r["silicon_ttft_ms"]), float(r["silicon_tpot_ms"]),
                    r["backend_version"], int(float(r["attention_dp_size"] or 1)),
                    int(float(r["moe_ep_size"] or 1)), r["id"]])
    return {
        "source": {"package": PACKAGE, "url": "https://pypi.org/project/aiconfigurator-core/0.12.0/",
                   "file": SILICON_CSV, "file_sha256": hashlib.sha256(raw).hexdigest(),
                   "filter": "system == h100_sxm (tested first: a row of another system is skipped before any "
                             f"other field is used), backend == vllm, mode == agg, model_path in {', '.join(MOE)}",
                   "columns_from": "model_path, isl, osl, batch_size (concurrent clients), tp_size, "
                                   "silicon_ttft_ms, silicon_tpot_ms, backend_version, attention_dp_size, "
                                   "moe_ep_size, id",
                   "rebuild": ".venv/bin/python bench/bench_silicon_moe.py --extract <the wheel>"},
        "columns": ["model", "isl", "osl", "concurrency", "tp", "ttft_ms", "tpot_ms", "vllm", "dp", "ep", "id"],
        "rows": out,
    }


def rows() -> list[Row]:
    """The runs: gpt-oss-120b's without DP or EP; MiniMax-M2.5's all as TP 4 with EP 4 (the docstring says why)."""
    with open(DATA_FILE, encoding="utf-8") as f:
        doc = json.load(f)
    minimax = "MiniMaxAI/MiniMax-M2.5"
    concurrency = {r[-1]: int(r[-1].split("_c")[1].split("_")[0]) for r in doc["rows"] if r[0] == minimax}
    return [Row(m, isl, osl, concurrency.get(run, c), tp, ttft / 1e3, tpot / 1e3, vllm, expert_parallel=m == minimax)
            for m, isl, osl, c, tp, ttft, tpot, vllm, dp, ep, run in doc["rows"] if m == minimax or dp == ep == 1]


def recipe(row: Row) -> Recipe:
    """InferenceX's recipes for its vLLM 0.18.0 sweeps (4-64 clients), the defaults for the rest."""
    if row.model == "MiniMaxAI/MiniMax-M2.5":
        return INFERENCEX_MINIMAX
    return INFERENCEX_GPTOSS if row.vllm == "0.18.0" else UNRECORDED


def deployment(row: Row, skew: float) -> Deployment:
    return Deployment(model=row.model, gpu="h100-sxm", tp=row.tp, enable_expert_parallel=row.expert_parallel,
                      moe_skew=skew, **recipe(row).deployment_knobs(row.isl, row.osl, row.concurrency))


def cost_models(row: Row, skew: float) -> dict:
    """The run's measured model (host in series, host hidden) and roofline."""
    plan = plan_deployment(deployment(row, skew))
    d = plan.deployment
    common = dict(tp=d.tp, block_size=d.block_size, weight_format=plan.weight_format, moe=plan.moe_parallel)
    graphs = dict(max_num_seqs=d.max_num_seqs, max_num_batched_tokens=plan.max_num_batched_tokens)
    return {"measured": MeasuredCostModel(plan.model, plan.gpu, **common, **graphs),
            "measured, async": MeasuredCostModel(plan.model, plan.gpu, **common, **graphs, async_scheduling=True),
            "roofline": RooflineCostModel(plan.model, plan.gpu, **common)}


def simulate(row: Row, skew: float) -> dict[str, tuple[float, float]]:
    """(mean TPOT, mean TTFT) of the run under each cost model: simulated once, its steps re-priced (a closed
    loop's schedule does not depend on step times while every step outlasts the clients' turnaround:
    silicon_recipes.Schedule)."""
    d = deployment(row, skew)
    spec = run_spec(d, workload="random", params=recipe(row).workload_params(row.isl, row.osl),
                    requests=recipe(row).requests(row.concurrency), concurrency=row.concurrency)
    models = cost_models(row, skew)
    sim = Simulation(spec, plan_deployment(d), models["measured"]).simulate()
    schedule = Schedule.of(sim, d.client_turnaround, row.label)
    return {name: schedule.reprice([model.step_time(s) for s in sim.shapes]) for name, model in models.items()}


def header(names: list[str]) -> None:
    print(f"{'run':58s} {'TPOT ms':>8s} " + " ".join(f"{n[:16]:>16s}" for n in names)
          + f" {'TTFT ms':>8s} " + " ".join(f"{n[:16]:>16s}" for n in names), flush=True)


def print_row(row: Row, res: dict) -> None:
    names = list(res)
    print(f"{row.label:58s} {row.tpot * 1e3:8.2f} "
          + " ".join(f"{res[n][0] * 1e3:9.2f} {res[n][0] / row.tpot - 1:+6.0%}" for n in names)
          + f" {row.ttft * 1e3:8.1f} "
          + " ".join(f"{res[n][1] * 1e3:9.1f} {res[n][1] / row.ttft - 1:+6.0%}" for n in names), flush=True)


def report(results: list[tuple[Row, dict]]) -> None:
    """Mean absolute (mean signed) error and median |error| per cost model, over all runs and per recipe."""
    names = list(results[0][1])
    groups = {"all": results}
    for row, res in results:
        groups.setdefault(recipe(row).name, []).append((row, res))
    for label, chosen in groups.items():
        print(f"\n{label}: {len(chosen)} runs; mean absolute error (mean signed error):")
        for n in names:
            for i, what in ((0, "TPOT"), (1, "TTFT")):
                rel = np.array([res[n][i] / (row.tpot if i == 0 else row.ttft) - 1 for row, res in chosen])
                print(f"  {n:18s} {what}: {np.mean(np.abs(rel)):6.1%} ({np.mean(rel):+6.1%}), median |err| "
                      f"{np.median(np.abs(rel)):6.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every fourth run only")
    parser.add_argument("--model", help="only the runs of this model (a part of its Hugging Face id)")
    parser.add_argument("--moe-skew", type=float, default=0.0, help="routing skew assumed (0: uniform)")
    parser.add_argument("--extract", metavar="WHEEL", help="rebuild bench/data/silicon_h100_vllm_moe.json and stop")
    args = parser.parse_args()
    if args.extract:
        doc = extract(args.extract)
        with open(DATA_FILE, "w", encoding="utf-8") as f:
            f.write(json.dumps({k: doc[k] for k in ("source", "columns")}, indent=2)[:-2] + ',\n  "rows": [\n'
                    + ",\n".join("    " + json.dumps(r) for r in doc["rows"]) + "\n  ]\n}\n")
        print(f"written: {os.path.relpath(DATA_FILE, ROOT)} ({len(doc['rows'])} runs)")
        return
    chosen = [r for r in rows() if args.model is None or args.model.lower() in r.model.lower()]
    chosen = chosen[::4] if args.quick else chosen
    # the lightest runs first (decoded tokens), each printed as it ends: an interrupted run keeps its rows
    chosen.sort(key=lambda r: recipe(r).requests(r.concurrency) * (r.isl + r.osl))
    start, results = time.perf_counter(), []
    header(["measured", "measured, async", "roofline"])
    for i, row in enumerate(chosen):
        results.append((row, simulate(row, args.moe_skew)))
        print_row(*results[-1])
        print(f"\rsimulated {i + 1}/{len(chosen)} runs ({time.perf_counter() - start:.0f} s)", end="", file=sys.stderr)
    print(file=sys.stderr)
    report(results)


if __name__ == "__main__":
    main()
