"""The measured cost model against NVIDIA's measured end-to-end vLLM runs on H100: per run, TPOT and TTFT, and the MAPE.

Data. aiconfigurator-core 0.12.0 (Apache-2.0) ships NVIDIA's own measured
vLLM runs in systems/silicon_sample.csv. bench/data/silicon_h100_vllm.json
holds the rows this bench uses, with their source record: system h100_sxm,
backend vllm, aggregated serving, dense models (the rows are filtered on the
system first; nothing of any other GPU is read or kept; `--extract WHEEL`
rebuilds the file from the wheel). That is Qwen3-32B bf16 (90 runs, vLLM
0.12.0: ISL 1024/4096, OSL 128/512/1024, 8-128 concurrent clients, TP 2/4/8),
Qwen3-32B FP8 (3 runs, Dynamo 0.8.0's vLLM runtime) and Llama-3.1-70B FP8
(45 runs, vLLM version unstated, measured 2025-10-29). The MoE rows
(gpt-oss-120b, MiniMax-M2.5, Qwen3-235B-A22B) are left out: the issue's
targets are dense models.

Each run is simulated as it was made: `planner simulate --model <id> --gpu
h100-sxm --tp N --policy vllm-v1 --workload random -p input_len=ISL
-p output_len=OSL --concurrency C --requests R [--quantization fp8]` with the
run's recipe (`Recipe`). Where the source says nothing: vLLM's API-server
defaults on H100 (max_num_batched_tokens 8192, max_num_seqs 1024:
vllm/engine/arg_utils.py EngineArgs.get_batch_defaults), prefix caching on,
max_model_len = ISL + OSL, fixed lengths, R = 8 x C (at least 64), priced
with synchronous scheduling (these vLLM versions ran the host work in series
with the GPU). The Llama-3.1-70B FP8 runs are InferenceMAX's, whose published
recipe says more (`silicon_recipes.INFERENCEMAX_LLAMA70B`: an FP8 KV cache, async scheduling,
no prefix caching, max_num_seqs = C, lengths uniform on [0.8 L, L],
R = 10 x C; `--kv-cache-dtype fp8 --async-scheduling --no-enable-prefix-caching
--max-num-seqs C --max-model-len 10240` and the random workload's lengths
centred on the interval with range_ratio 1/9).

Fit. Only constants with a physical meaning are fitted, never a factor per
run or per model: vLLM's host time per engine step and per scheduled
sequence (planner/cost/calibration.py). Each adds a fixed time to every step,
so a run's mean TPOT is linear in them (`design`); they are fitted by least
squares on relative TPOT errors, reweighted to minimise the mean absolute
relative error (MAPE), each constant held >= 0 (`fit_constants`). The fit set
is Qwen3-32B bf16; every FP8 run (Llama-3.1-70B, Qwen3-32B) is held out and
never seen by the fit. TTFT is not in the objective: in these runs it depends
mostly on how the clients' requests fall into steps (docs/calibration.md),
which a host constant must not absorb. The elementwise kernels' floor stays
at aiconfigurator's own constant (3 us, systems/h100_sxm.yaml
mem_empirical_constant_latency): every step of one model launches the same
number of them, so on these runs a per-kernel floor and a per-step host time
are one constant and cannot be told apart.

Before/after each term. A closed loop's schedule does not depend on step
durations (clients send only when a request ends, which is at a step's end),
so each run is simulated once with the full model and its recorded steps are
re-priced under each configuration (the output checks that re-pricing the
full model reproduces the simulation). Configurations, cumulative, with the
prior constants: the model before the ledger (every new term left out, our
engine's host path as host time), then each term added; last, all terms with
the fitted constants.

    .venv/bin/python bench/bench_silicon_h100.py [--quick] [--fit [--write]] [--recordings FILE]
                                                 [--aiconfigurator-recipe]
    .venv/bin/python bench/bench_silicon_h100.py --extract aiconfigurator_core-0.12.0-*.whl
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import pickle
import sys
import time
import zipfile
from dataclasses import astuple, dataclass, replace

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from engine.deployment import Deployment  # noqa: E402
from planner.api import run_spec  # noqa: E402
from planner.cost.calibration import CALIBRATION_FILE, CONSTANTS, Calibration, load_calibration  # noqa: E402
from planner.cost.measured import (LEGACY_HOST_BASE_S, LEGACY_HOST_PER_SEQ_S, TERM_FAMILIES,  # noqa: E402
                                   MeasuredCostModel)
from planner.deploy.plan import plan_deployment  # noqa: E402
from planner.runs.pipeline import Simulation  # noqa: E402
from silicon_recipes import AICONFIGURATOR_AGG, INFERENCEMAX_LLAMA70B, VLLM_DEFAULTS, Recipe, Schedule  # noqa: E402

DATA_FILE = os.path.join(ROOT, "bench", "data", "silicon_h100_vllm.json")
SILICON_CSV = "aiconfigurator_core/systems/silicon_sample.csv"
PACKAGE = "aiconfigurator-core 0.12.0 (Apache-2.0)"
# The dense models among the h100_sxm vLLM rows; the MoE ones are left out (module docstring).
DENSE = ("Qwen/Qwen3-32B", "meta-llama/Llama-3.1-70B")

# The constants before the fit: aiconfigurator's per-kernel floor for H100 (systems/h100_sxm.yaml
# mem_empirical_constant_latency) and our own engine's host path (planner/cost/measured.py LEGACY_HOST_*).
PRIORS = Calibration(elementwise_floor_s=3e-6, host_step_s=LEGACY_HOST_BASE_S, host_seq_s=LEGACY_HOST_PER_SEQ_S,
                     source={"fitted_to": "priors (not fitted)"})
FITTED = ("host_step_s", "host_seq_s")
CONFIGS = (       # (label, the TERM_FAMILIES left out); cumulative, each with the prior constants
    ("before the ledger (new terms left out)", TERM_FAMILIES),
    ("+ chunk attention by its work", TERM_FAMILIES[1:]),
    ("+ NCCL above the custom all-reduce buffer", TERM_FAMILIES[2:]),
    ("+ CUDA-graph padding", ("elementwise", "logits_gather", "host")),
    ("+ elementwise kernels (3 us floor)", ("logits_gather", "host")),
    ("+ logits all-gather (all terms, priors)", ("host",)),
)
FITTED_LABEL = "all terms, fitted host time"


# ---- the runs --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    """One measured run: model, weights, ISL, OSL, concurrent clients, TP, measured means (seconds)."""

    model: str
    weights: str
    isl: int
    osl: int
    concurrency: int
    tp: int
    ttft: float
    tpot: float
    vllm: str

    @property
    def split(self) -> str:
        return "fit" if self.weights == "bf16" else "held-out"

    @property
    def label(self) -> str:
        short = "qwen3-32b" if "Qwen" in self.model else "llama-3.1-70b"
        return f"{short} {self.weights} {self.isl}/{self.osl} c{self.concurrency} tp{self.tp}"


def extract(wheel: str) -> dict:
    """The derived data file from aiconfigurator-core's wheel: the h100_sxm vLLM aggregated runs of dense
    models. The system is the first filter, so no other GPU's row is kept or looked at."""
    with zipfile.ZipFile(wheel) as z:
        raw = z.read(SILICON_CSV)
    out = []
    for r in csv.DictReader(io.StringIO(raw.decode("utf-8"))):
        if r["system"] != "h100_sxm":
            continue
        if r["backend"] != "vllm" or r["mode"] != "agg" or r["model_path"] not in DENSE:
            continue
        image = next((p.split("=", 1)[1] for p in r["silicon_data_source"].split("; ") if p.startswith("image=")), "")
        measured = next((p.split("=", 1)[1][:10] for p in r["silicon_data_source"].split("; ")
                         if p.startswith("measured=")), "")
        vllm = r["backend_version"] or f"unstated (measured {measured})"
        if "dynamo" in image:
            vllm = f"{vllm}, {image.rsplit('/', 1)[-1]}"
        out.append([r["model_path"], r["gemm_quant_mode"] or "bf16", int(r["isl"]), int(r["osl"]),
                    int(r["batch_size"]), int(r["tp_size"]), float(r["silicon_ttft_ms"]),
                    float(r["silicon_tpot_ms"]), vllm, r["id"]])
    return {
        "source": {"package": PACKAGE, "url": "https://pypi.org/project/aiconfigurator-core/0.12.0/",
                   "file": SILICON_CSV, "file_sha256": hashlib.sha256(raw).hexdigest(),
                   "filter": "system == h100_sxm (tested first: a row of another system is skipped before any other field is used), backend == vllm, mode == agg, "
                             f"model_path in {', '.join(DENSE)} (dense; the MoE rows are left out)",
                   "columns_from": "model_path, gemm_quant_mode ('' = bf16), isl, osl, batch_size (concurrent "
                                   "clients), tp_size, silicon_ttft_ms, silicon_tpot_ms, backend_version / "
                                   "silicon_data_source (vLLM version or image), id",
                   "rebuild": ".venv/bin/python bench/bench_silicon_h100.py --extract <the wheel>"},
        "columns": ["model", "weights", "isl", "osl", "concurrency", "tp", "ttft_ms", "tpot_ms", "vllm", "id"],
        "rows": out,
    }


def rows() -> list[Row]:
    """The runs of bench/data/silicon_h100_vllm.json."""
    with open(DATA_FILE, encoding="utf-8") as f:
        doc = json.load(f)
    return [Row(m, w, isl, osl, c, tp, ttft / 1e3, tpot / 1e3, vllm)
            for m, w, isl, osl, c, tp, ttft, tpot, vllm, _ in doc["rows"]]


# The Llama-3.1-70B FP8 runs measured 2025-10-29 are InferenceMAX's: the same grid (ISL/OSL 1k/1k, 1k/8k,
# 8k/1k; 4-64 clients; TP 2/4/8) and the date its last Llama-70B sweep ran (silicon_recipes.py cites the recipe).
INFERENCEMAX_RUNS = "unstated (measured 2025-10-29)"


# NVIDIA's own vLLM 0.12.0 runs record no recipe: vLLM's API-server defaults unless --aiconfigurator-recipe
# (`silicon_recipes.AICONFIGURATOR_AGG`, an alternative docs/calibration.md reports, not adopted).
NVIDIA_RUNS = "0.12.0"
nvidia_recipe = VLLM_DEFAULTS


def recipe(row: Row) -> Recipe:
    if row.vllm == INFERENCEMAX_RUNS:
        return INFERENCEMAX_LLAMA70B
    return nvidia_recipe if row.vllm == NVIDIA_RUNS else VLLM_DEFAULTS


def workload_params(row: Row) -> dict:
    return recipe(row).workload_params(row.isl, row.osl)


def deployment(row: Row) -> Deployment:
    return Deployment(model=row.model, gpu="h100-sxm", tp=row.tp,
                      quantization=None if row.weights == "bf16" else row.weights,
                      **recipe(row).deployment_knobs(row.isl, row.osl, row.concurrency))


def cost_model(row: Row, leave_out=(), calibration: Calibration | None = None,
               async_scheduling: bool | None = None) -> MeasuredCostModel:
    """The measured model for the row's deployment, with the run's scheduling (vLLM 0.12's synchronous
    engine loop unless its recipe turned async scheduling on; `async_scheduling` overrides it)."""
    plan = plan_deployment(deployment(row))
    d = plan.deployment
    return MeasuredCostModel(plan.model, plan.gpu, tp=d.tp, block_size=d.block_size, weight_format=plan.weight_format,
                             kv_cache_dtype=d.kv_cache_dtype, max_num_seqs=d.max_num_seqs,
                             max_num_batched_tokens=plan.max_num_batched_tokens,
                             async_scheduling=d.async_scheduling if async_scheduling is None else async_scheduling,
                             leave_out=leave_out, calibration=calibration)


@dataclass
class Recording:
    """One run simulated: its steps as the cost model saw them and its schedule (silicon_recipes.Schedule)."""

    row: Row
    shapes: list
    schedule: Schedule
    simulated: tuple[float, float]     # the simulation's own (mean TPOT, mean TTFT)
    preemptions: int
    recipe: str = ""                   # the name of the recipe it was simulated with


def record(row: Row) -> Recording:
    """Simulate the run as it was made (closed loop, its recipe's lengths and request count) with the
    shipped constants."""
    d = deployment(row)
    spec = run_spec(d, workload="random", params=workload_params(row), requests=recipe(row).requests(row.concurrency),
                    concurrency=row.concurrency)
    sim = Simulation(spec, plan_deployment(d), cost_model(row)).simulate()
    m = sim.metrics
    return Recording(row, list(sim.shapes), Schedule.of(sim, d.client_turnaround, row.label),
                     (m.tpot_mean, m.ttft_mean), int(m.preemptions["total"]), recipe(row).name)


def reprice(rec: Recording, model: MeasuredCostModel) -> tuple[float, float]:
    """(mean TPOT, mean TTFT) of the recorded run with every step priced by `model`."""
    return rec.schedule.reprice([model.step_time(s) for s in rec.shapes])


def mape(predicted, measured) -> float:
    p, m = np.asarray(predicted), np.asarray(measured)
    return float(np.mean(np.abs(p / m - 1)) * 100)


def evaluate(recs: list[Recording], leave_out=(), calibration: Calibration | None = None,
             async_scheduling: bool | None = None) -> np.ndarray:
    """Per run (TPOT, TTFT) under a configuration."""
    return np.array([reprice(r, cost_model(r.row, leave_out, calibration, async_scheduling)) for r in recs])


# ---- the fit -------------------------------------------------------------------------------------

def design(recs: list[Recording], fixed: Calibration) -> tuple[np.ndarray, np.ndarray]:
    """TPOT is linear in the host constants (each adds a fixed time per step or per sequence to every
    step): per run, TPOT with them at zero, and its change per second of each (a column per constant)."""
    zero = replace(fixed, **dict.fromkeys(FITTED, 0.0))
    base = evaluate(recs, calibration=zero)[:, 0]
    columns = [evaluate(recs, calibration=replace(zero, **{name: 1e-6}))[:, 0] - base for name in FITTED]
    return base, np.stack(columns, axis=1) / 1e-6


def fit_constants(recs: list[Recording], fixed: Calibration, rounds: int = 50) -> Calibration:
    """`fixed` with the FITTED constants minimising the mean absolute relative TPOT error on `recs`:
    least squares on relative errors, iteratively reweighted by 1/|error| (which turns the squared
    error into the absolute one), a constant that wants to be negative held at zero."""
    base, per_unit = design(recs, fixed)
    measured = np.array([r.row.tpot for r in recs])
    active = list(range(len(FITTED)))
    c = np.zeros(len(FITTED))
    weights = 1 / measured
    for _ in range(rounds):
        a = per_unit[:, active] * weights[:, None]
        b = (measured - base) * weights
        c_active, *_ = np.linalg.lstsq(a, b, rcond=None)
        c = np.zeros(len(FITTED))
        c[active] = c_active
        if (c < 0).any():
            active = [i for i in active if c[i] > 0]
            continue
        residual = np.abs(base + per_unit @ c - measured) / measured
        weights = 1 / (measured * np.maximum(residual, 1e-3))
    return replace(fixed, **dict(zip(FITTED, map(float, c))), source={"fitted_to": "this run's --fit"})


MEANINGS = {
    "elementwise_floor_s": ("s per kernel", "time a memory-bound elementwise kernel (norm, rotary, KV-cache write, "
                            "activation) costs beyond its bytes at the effective bandwidth: the launch and ramp "
                            "of a small kernel replayed in a CUDA graph. Not fitted: aiconfigurator's own constant "
                            "(systems/h100_sxm.yaml mem_empirical_constant_latency, 3 us); on these runs it is "
                            "not separable from the per-step host time (a fixed count of kernels per step)"),
    "host_step_s": ("s per engine step", "time per step beyond the priced GPU terms, in series with them: vLLM "
                    "0.12's host work (schedule(), the worker's input preparation and host-to-device copies, "
                    "launching the graph, waiting for the sampled tokens, update_from_output, sending the "
                    "outputs) and any per-step GPU time the tables miss"),
    "host_seq_s": ("s per scheduled sequence", "the same, per sequence in the step: per-request Python in "
                   "scheduling, input preparation, output update and serialisation, and any per-sequence GPU "
                   "time the tables miss"),
}


def write_calibration(calibration: Calibration, figures: dict) -> None:
    """planner/data/measured_calibration.json: the constants, their meaning and what they were fitted to."""
    doc = {
        "description": "Constants of the measured cost model (planner/cost/measured.py) fitted to NVIDIA's "
                       "public end-to-end vLLM runs on H100; see docs/calibration.md.",
        "source": {
            "fitted_to": "NVIDIA's measured vLLM 0.12.0 runs of Qwen/Qwen3-32B bf16 on H100 SXM (mean TPOT)",
            "package": f"{PACKAGE}, systems/silicon_sample.csv",
            "rows": "bench/data/silicon_h100_vllm.json (system h100_sxm, backend vllm, mode agg, dense models)",
            "rows_fitted": "Qwen/Qwen3-32B bf16: 90 runs (ISL 1024/4096, OSL 128/512/1024, 8-128 clients, "
                           "TP 2/4/8)",
            "rows_held_out": "every FP8 run: meta-llama/Llama-3.1-70B (45), Qwen/Qwen3-32B (3)",
            "no_other_gpu": "only h100_sxm rows were kept (the extraction skips every other system's row before using any other field); nothing was fitted per model or per run",
            "objective": "mean absolute relative error of the mean TPOT (least squares on relative errors, "
                         "iteratively reweighted), each run simulated as it was made (closed loop; a run's published "
                         "recipe where it has one, else vLLM's H100 API-server limits, synchronous scheduling and "
                         "fixed lengths)",
            "refit": ".venv/bin/python bench/bench_silicon_h100.py --fit --write",
            "figures": figures,
        },
        "constants": {name: {"value": round(float(getattr(calibration, name)), 7),    # to 0.1 us
                             "unit": MEANINGS[name][0],
                             "meaning": MEANINGS[name][1], "fitted": name in FITTED}
                      for name in CONSTANTS},
    }
    with open(os.path.join(ROOT, "planner", CALIBRATION_FILE), "w", encoding="utf-8") as f:
        f.write(json.dumps(doc, indent=2) + "\n")
    load_calibration.cache_clear()


# ---- the output ----------------------------------------------------------------------------------

SPLITS = ("fit", "held-out", "all")


def split_mape(recs: list[Recording], values: np.ndarray) -> dict:
    """MAPE (percent) of TPOT and TTFT on the fit runs, the held-out runs and all of them."""
    out = {}
    for split in SPLITS:
        chosen = [i for i, r in enumerate(recs) if split == "all" or r.row.split == split]
        if chosen:
            out[split] = {"runs": len(chosen),
                          "tpot_mape": round(mape(values[chosen, 0], [recs[i].row.tpot for i in chosen]), 2),
                          "ttft_mape": round(mape(values[chosen, 1], [recs[i].row.ttft for i in chosen]), 2)}
    return out


def print_terms(recs: list[Recording], fitted: Calibration) -> dict[str, np.ndarray]:
    """The MAPE table, one line per configuration; returns each configuration's per-run values."""
    head = "".join(f"{s + ' ' + k:>15}" for s in SPLITS for k in ("TPOT", "TTFT"))
    print(f"\n{'configuration (cumulative)':<44}{head}")
    results = {label: evaluate(recs, leave_out, PRIORS) for label, leave_out in CONFIGS}
    results[FITTED_LABEL] = evaluate(recs, (), fitted)
    for label, values in results.items():
        m = split_mape(recs, values)
        cells = [f"{m[s][k]:.1f}%" if s in m else "-" for s in SPLITS for k in ("tpot_mape", "ttft_mape")]
        print(f"{label:<44}" + "".join(f"{c:>15}" for c in cells))
    return results


def print_recipes(recs: list[Recording], fitted: Calibration, values: np.ndarray) -> None:
    """Per recipe, the fitted configuration's MAPE and mean TPOT error; a recipe with async scheduling
    also with its host time in series, the other side of what async scheduling can save."""
    print(f"\n{'runs by recipe (all terms, fitted host time)':<76}{'runs':>5}{'TPOT':>8}{'mean':>8}{'TTFT':>8}")
    for r in dict.fromkeys(recipe(rec.row) for rec in recs):
        chosen = [i for i, rec in enumerate(recs) if recipe(rec.row) is r]
        sets = [(r.name, values[chosen])]
        if r.async_scheduling:
            serial = evaluate([recs[i] for i in chosen], (), fitted, async_scheduling=False)
            sets.append((f"{r.name}, host time in series", serial))
        tpot, ttft = np.array([recs[i].row.tpot for i in chosen]), np.array([recs[i].row.ttft for i in chosen])
        for label, v in sets:
            print(f"{label:<76}{len(chosen):>5}{mape(v[:, 0], tpot):>7.1f}%{np.mean(v[:, 0] / tpot - 1) * 100:>+7.1f}%"
                  f"{mape(v[:, 1], ttft):>7.1f}%")


def print_rows(recs: list[Recording], before: np.ndarray, priors: np.ndarray, after: np.ndarray) -> None:
    """Per run: measured TPOT and TTFT, the model before the ledger, with its terms at the priors, fitted."""
    print(f"\n{'run':<36}{'TPOT ms':>8}{'before':>8}{'priors':>8}{'fitted':>8}{'err':>6}  "
          f"{'TTFT ms':>9}{'before':>9}{'fitted':>9}{'err':>7}{'preempt':>8}")
    for rec, b, p, a in zip(recs, before, priors, after):
        r = rec.row
        print(f"{r.label:<36}{r.tpot * 1e3:>8.2f}{b[0] * 1e3:>8.2f}{p[0] * 1e3:>8.2f}{a[0] * 1e3:>8.2f}"
              f"{a[0] / r.tpot - 1:>+6.0%}  {r.ttft * 1e3:>9.1f}{b[1] * 1e3:>9.1f}{a[1] * 1e3:>9.1f}"
              f"{a[1] / r.ttft - 1:>+7.0%}{rec.preemptions:>8d}")


def recordings(chosen: list[Row], cache: str | None) -> list[Recording]:
    """Each run simulated once (or read back from `cache`, a pickle of an earlier run's recordings)."""
    if cache and os.path.exists(cache):
        with open(cache, "rb") as f:
            recs = pickle.load(f)
        # by value (the classes may differ), and simulated with the recipes the bench has now
        if [(astuple(r.row), r.recipe) for r in recs] == [(astuple(row), recipe(row).name) for row in chosen]:
            return recs
    start, recs = time.perf_counter(), []
    for i, row in enumerate(chosen):
        recs.append(record(row))
        print(f"\rsimulated {i + 1}/{len(chosen)} runs ({time.perf_counter() - start:.0f} s)", end="", file=sys.stderr)
    print(file=sys.stderr)
    if cache:
        with open(cache, "wb") as f:
            pickle.dump(recs, f)
    return recs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every fourth run only")
    parser.add_argument("--fit", action="store_true", help="refit the host constants on the fit runs and use them")
    parser.add_argument("--write", action="store_true", help="with --fit: write them to planner/" + CALIBRATION_FILE)
    parser.add_argument("--recordings", metavar="FILE", help="keep the simulated runs in FILE (a pickle) and reuse "
                                                             "them (the schedule does not depend on the constants)")
    parser.add_argument("--extract", metavar="WHEEL", help="rebuild bench/data/silicon_h100_vllm.json from "
                                                           "aiconfigurator-core's wheel and stop")
    parser.add_argument("--aiconfigurator-recipe", action="store_true",
                        help="simulate NVIDIA's Qwen3-32B vLLM 0.12.0 runs as aiconfigurator's generator deploys and "
                             "loads vLLM (silicon_recipes.AICONFIGURATOR_AGG) instead of on vLLM's defaults")
    args = parser.parse_args()
    if args.aiconfigurator_recipe:
        global nvidia_recipe
        nvidia_recipe = AICONFIGURATOR_AGG
    if args.extract:
        doc = extract(args.extract)
        with open(DATA_FILE, "w", encoding="utf-8") as f:
            f.write(json.dumps({k: doc[k] for k in ("source", "columns")}, indent=2)[:-2] + ',\n  "rows": [\n'
                    + ",\n".join("    " + json.dumps(r) for r in doc["rows"]) + "\n  ]\n}\n")
        print(f"written: {os.path.relpath(DATA_FILE, ROOT)} ({len(doc['rows'])} runs)")
        return
    if args.write and not args.fit:
        parser.error("--write writes what --fit fitted: give both")
    chosen = rows()[::4] if args.quick else rows()
    recs = recordings(chosen, args.recordings)
    shipped = load_calibration()
    if args.recordings is None:
        again = evaluate(recs, (), shipped)
        agree = max(max(abs(f / s - 1), abs(g / t - 1)) for (f, g), (s, t) in zip(again, (r.simulated for r in recs)))
        print(f"re-pricing the recorded steps reproduces the simulations' mean TPOT and TTFT to {agree:.1e}")
    fitted = shipped
    if args.fit:
        fitted = fit_constants([r for r in recs if r.row.split == "fit"], replace(shipped, elementwise_floor_s=3e-6))
    print("constants: " + ", ".join(f"{k} = {getattr(fitted, k) * 1e6:.2f} us" for k in CONSTANTS)
          + (" (fitted now)" if args.fit else f" ({fitted.source.get('fitted_to')})"))
    results = print_terms(recs, fitted)
    print_recipes(recs, fitted, results[FITTED_LABEL])
    print_rows(recs, results[CONFIGS[0][0]], results[CONFIGS[-1][0]], results[FITTED_LABEL])
    if args.fit and args.write:
        if args.quick:
            sys.exit("--write needs every run: leave out --quick")
        figures = {label: split_mape(recs, values) for label, values in results.items()}
        write_calibration(fitted, figures)
        print(f"written: planner/{CALIBRATION_FILE}")


if __name__ == "__main__":
    main()
