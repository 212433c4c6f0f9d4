"""How the measured H100 vLLM runs the silicon benches compare with were served and loaded, as far as
their sources say (bench/bench_silicon_h100.py, bench/bench_silicon_moe.py).

A run is simulated as it was made: the server options that change the schedule or the prices, and the
benchmark client's lengths and request count. Where a run's source records nothing, its recipe is vLLM's
API-server defaults on H100 (vllm/engine/arg_utils.py EngineArgs.get_batch_defaults: 8,192 batched tokens,
1,024 sequences), prefix caching on, max_model_len = ISL + OSL, fixed lengths. InferenceMAX (SemiAnalysis,
github.com/InferenceMAX/InferenceMAX, now SemiAnalysisAI/InferenceX) publishes its recipes: its client
(utils/bench_serving/benchmark_serving.py, `sample_random_requests`) draws every input and output length
uniformly on [int(0.8 L), L] (--random-range-ratio 0.8, the older vLLM reading of the ratio) and sends
10 x CONC prompts (--num-prompts $((CONC * 10)) --max-concurrency $CONC --request-rate inf --ignore-eos).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from planner.sim.clients import SERVED_TURNAROUND


@dataclass(frozen=True)
class Recipe:
    """A run's server options and client load (None where the run's own figures fill it in)."""

    name: str
    kv_cache_dtype: str = "auto"
    prefix_caching: bool = True
    max_num_seqs: int | None = 1024         # None: the run's concurrency (--max-num-seqs=$CONC)
    max_num_batched_tokens: int | None = 8192   # None: concurrency + ISL + budget_margin
    budget_margin: int = 0
    max_model_len: int | None = None        # None: ISL + OSL + max_model_len_margin
    max_model_len_margin: int = 0
    async_scheduling: bool = False
    # A client of vLLM's API server: its next request joins the step after the one running when its previous
    # request ended (planner/sim/clients.py). 0, the planner's default, where the run records no client.
    client_turnaround: float = 0.0
    low_fraction: float = 1.0               # lengths uniform on [int(L x low_fraction), L]
    requests_per_client: int = 8
    min_requests: int = 64

    def deployment_knobs(self, isl: int, osl: int, concurrency: int) -> dict:
        """The Deployment settings the recipe fixes for a run (model, GPU, TP and formats aside)."""
        return dict(policy="vllm-v1", enable_prefix_caching=self.prefix_caching, kv_cache_dtype=self.kv_cache_dtype,
                    async_scheduling=self.async_scheduling, client_turnaround=self.client_turnaround,
                    max_num_batched_tokens=self.max_num_batched_tokens or concurrency + isl + self.budget_margin,
                    max_num_seqs=self.max_num_seqs or concurrency,
                    max_model_len=self.max_model_len or isl + osl + self.max_model_len_margin)

    def requests(self, concurrency: int) -> int:
        return max(self.requests_per_client * concurrency, self.min_requests)

    def workload_params(self, isl: int, osl: int) -> dict:
        """The random workload's parameters (its lengths range over [len x (1 - r), len x (1 + r)], vLLM's
        reading): fixed lengths, or uniform on [int(L x f), L] for both with one r = (1 - f) / (1 + f), each
        centre picked (and checked) to give exactly the client's bounds."""
        f = self.low_fraction
        if f == 1.0:
            return {"input_len": isl, "output_len": osl}
        ratio = (1 - f) / (1 + f)

        def centre(length: int) -> int:
            middle = length * (1 + f) / 2
            for c in sorted(range(int(middle) - 1, int(middle) + 3), key=lambda c: abs(c - middle)):
                if (max(1, int(c * (1 - ratio))), int(c * (1 + ratio))) == (int(length * f), length):
                    return c
            raise ValueError(f"no centre gives [{int(length * f)}, {length}]")

        return {"input_len": centre(isl), "output_len": centre(osl), "range_ratio": ratio}


VLLM_DEFAULTS = Recipe("vLLM's H100 API-server defaults, fixed lengths")

# How aiconfigurator's generator deploys and loads an aggregated vLLM worker (github.com/ai-dynamo/aiconfigurator,
# src/aiconfigurator/generator/rule_plugin/vllm.rule since 95ddf241a, 2025-12-04, and benchmark/bench_run.sh.j2
# at 095f58a51): --max-num-seqs = the batch size, --max-num-batched-tokens = batch size + ISL + 1500,
# --max-model-len = ISL + OSL + 1500, CUDA graphs for every batch size up to it; aiperf at --concurrency C with
# fixed lengths (--isl-stddev 0 --osl-stddev 0), ignore_eos, 20 x C requests after 2 x C warm-up requests. NVIDIA's
# Qwen3-32B runs sweep its default concurrencies (8-128 of 1, 2, 8, ..., 128), but nothing says they were made so:
# an alternative the bench can price (--aiconfigurator-recipe), not the one it uses (docs/calibration.md).
AICONFIGURATOR_AGG = Recipe("aiconfigurator's generated vLLM agg deployment and aiperf sweep", prefix_caching=False,
                            max_num_seqs=None, max_num_batched_tokens=None, budget_margin=1500,
                            max_model_len_margin=1500, requests_per_client=20, min_requests=0)

# InferenceMAX's Llama-3.1-70B FP8 H100 recipe (benchmarks/70b_fp8_h100_slurm.sh and
# .github/workflows/70b-tmpl.yml at c99f2e6, vllm/vllm-openai:v0.11.0): --kv-cache-dtype fp8
# --async-scheduling --no-enable-prefix-caching --max-num-batched-tokens 8192 --max-model-len 10240
# --max-num-seqs $CONC.
INFERENCEMAX_LLAMA70B = Recipe("InferenceMAX's 70b_fp8_h100 recipe (vLLM 0.11.0)", kv_cache_dtype="fp8",
                               prefix_caching=False, max_num_seqs=None, max_model_len=10240, async_scheduling=True,
                               client_turnaround=SERVED_TURNAROUND, low_fraction=0.8, requests_per_client=10,
                               min_requests=0)

# InferenceX's gpt-oss-120b H100 recipe as the vLLM 0.18.0 runs were made (benchmarks/single_node/
# gptoss_fp4_h100.sh and .github/configs/nvidia-master.yaml gptoss-fp4-h100-vllm at cec542a9, 2026-03-27,
# vllm/vllm-openai:v0.18.0): --no-enable-prefix-caching --max-num-batched-tokens 8192 --max-model-len 10240
# --max-num-seqs $CONC (and --max-cudagraph-capture-size 2048, VLLM_MXFP4_USE_MARLIN=1, which the measured
# model does not take); async scheduling is vLLM 0.18's default.
INFERENCEX_GPTOSS = Recipe("InferenceX's gptoss_fp4_h100 recipe (vLLM 0.18.0)", prefix_caching=False,
                           max_num_seqs=None, max_model_len=10240, async_scheduling=True,
                           client_turnaround=SERVED_TURNAROUND, low_fraction=0.8, requests_per_client=10,
                           min_requests=0)

# InferenceX's MiniMax-M2.5 FP8 H100 recipe as its vLLM 0.18.0 runs were made (benchmarks/single_node/
# minimaxm2.5_fp8_h100.sh and .github/configs/nvidia-master.yaml minimaxm2.5-fp8-h100-vllm at 1d5cae1,
# 2026-03-27 07:59:46 UTC, three seconds before the first runs' recorded start): TP 4 with
# --enable-expert-parallel (the only H100 point of the search space), --max-num-seqs 256, --gpu-memory-
# utilization 0.90, max_model_len = ISL + OSL + 200 (utils/matrix_logic/generate_sweep_configs.py), prefix
# caching on (turned off the same evening, 0f78cf4; random prompts share no block, so the schedule is the
# same either way), --compilation-config '{"cudagraph_mode":"PIECEWISE"}' (attention outside the graphs:
# not modelled), vLLM's default token budget (8,192 on H100); async scheduling is vLLM 0.18's default.
INFERENCEX_MINIMAX = Recipe("InferenceX's minimaxm2.5_fp8_h100 recipe (vLLM 0.18.0)", max_num_seqs=256,
                            max_model_len_margin=200, async_scheduling=True, client_turnaround=SERVED_TURNAROUND,
                            low_fraction=0.8, requests_per_client=10, min_requests=0)


@dataclass
class Schedule:
    """A simulated closed-loop run's schedule, to be priced again by other cost models: per completed
    request, the steps at whose ends it was sent (plus the turnaround; -1: at time 0), got its first token
    and finished, its tokens, and the idle time before each step."""

    arrival: np.ndarray
    first: np.ndarray
    finish: np.ndarray
    tokens: np.ndarray
    idle: np.ndarray
    turnaround: float
    label: str

    @classmethod
    def of(cls, sim, turnaround: float, label: str) -> "Schedule":
        ends = [0.0] + [step.end for step in sim.steps]
        index = {end: i - 1 for i, end in enumerate(ends)}

        def sent_after(t: float) -> int:
            return -1 if t == 0.0 else bisect.bisect_right(ends, t - turnaround / 2) - 2

        done = [r for r in sim.requests if not r.rejected and not r.truncated and r.first_token is not None]
        return cls(np.array([sent_after(r.arrival) for r in done], dtype=np.int64),
                   np.array([index[r.first_token] for r in done], dtype=np.int64),
                   np.array([index[r.finish] for r in done], dtype=np.int64),
                   np.array([r.seq_output_len for r in done]),
                   np.array([step.start - end for step, end in zip(sim.steps, ends)]), turnaround, label)

    def reprice(self, durations) -> tuple[float, float]:
        """(mean TPOT, mean TTFT) with the steps lasting `durations`. The schedule holds while every step
        lasts longer than the clients' turnaround (checked): a request sent during a step joins the next
        one whatever the step's length, and one sent at a step's end joins the next step."""
        durations = np.asarray(durations)
        if self.turnaround and durations.min() <= self.turnaround:
            raise SystemExit(f"{self.label}: a step priced at {durations.min() * 1e3:.3f} ms, within the clients' "
                             f"turnaround: re-pricing cannot keep the simulated schedule")
        ends = np.concatenate(([0.0], np.cumsum(durations + self.idle)))
        arrival = ends[self.arrival + 1] + np.where(self.arrival >= 0, self.turnaround, 0.0)
        many = self.tokens > 1
        tpot = (ends[self.finish + 1] - ends[self.first + 1])[many] / (self.tokens[many] - 1)
        return float(tpot.mean()), float((ends[self.first + 1] - arrival).mean())
