"""Prefill/decode disaggregation as a run's topology: `--pd P:D` and the settings of each pool.

A `Disaggregation` says how many replicas each pool has, on which GPU and TP
(each defaults to the deployment's `--gpu` and `--tp`), what else a pool sets
apart from the deployment (`--prefill-set` / `--decode-set KEY=VALUE`: its batch
limits, its data and expert parallelism, its MoE all2all backend), and the link
the KV caches cross (`--kv-link`, planner/data/links.json). `check` refuses, in one
line each, what would make no sense: a pool of zero, `--pd` beside `--replicas`,
the paper's policy (vLLM's KV connector is a vLLM v1 feature: give `--policy
vllm-v1`), and NVLink for pools that do not fit in one node. Speculative
decoding applies to both pools (the decode pool drafts). The simulation itself
is planner/sim/pd.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.deployment import Deployment
from planner.catalog.links import resolve_link
from planner.errors import PlannerError

PD_FLAGS = ("prefill_gpu", "prefill_tp", "decode_gpu", "decode_tp", "kv_link")
POOL_SETS = ("prefill_set", "decode_set")
# The deployment settings one pool may set apart from the other (GPU and TP have flags of their own); the model,
# its weights' and KV cache's formats and the block size are both pools', as the KV transfer needs them alike.
POOL_KEYS = ("dp", "enable_expert_parallel", "all2all_backend", "enable_eplb", "num_redundant_experts", "moe_backend",
             "enable_dbo", "dbo_decode_token_threshold", "dbo_prefill_token_threshold", "moe_skew", "max_num_seqs",
             "max_num_batched_tokens", "gpu_memory_utilization", "async_scheduling", "node_link")


def parse_pool_set(pool: str, items) -> tuple[tuple[str, str], ...]:
    """`--prefill-set KEY=VALUE ...` (pool "prefill") -> ((key, value), ...), each a setting of POOL_KEYS whose
    value the deployment takes, or a one-line error."""
    flag, pairs = f"--{pool}-set", {}
    for item in items or ():
        key, sep, value = str(item).partition("=")
        key, value = key.strip().removeprefix("--").replace("-", "_"), value.strip()
        if not sep or not key or not value:
            raise PlannerError(f"{flag} {item!r}: give KEY=VALUE, e.g. {flag} max_num_seqs=512")
        if key not in POOL_KEYS:
            raise PlannerError(f"{flag} {key}: a pool sets apart only {', '.join(POOL_KEYS)} (--{pool}-gpu and "
                               f"--{pool}-tp set its GPU and TP; the rest is both pools')")
        try:
            Deployment.parse_value(key, value)
        except ValueError:
            wanted = {int: "a whole number", float: "a number", bool: "true or false"}[Deployment.field_type(key)]
            raise PlannerError(f"{flag} {key}={value}: give {wanted}") from None
        pairs[key] = value           # checked with the rest of the pool's deployment (Disaggregation.pools)
    return tuple(pairs.items())


def parse_pd(text: str) -> tuple[int, int]:
    """`P:D` -> (P, D), both whole numbers >= 1, or a one-line error."""
    prefill, sep, decode = str(text).strip().partition(":")
    try:
        counts = (int(prefill), int(decode)) if sep else None
    except ValueError:
        counts = None
    if counts is None:
        raise PlannerError(f"--pd {text!r}: give P:D, the prefill and decode replicas, e.g. --pd 1:3")
    if min(counts) < 1:
        raise PlannerError(f"--pd {text}: each pool needs at least one replica")
    return counts


def parse_pd_list(text: str) -> tuple[tuple[int, int], ...]:
    """`P:D,P:D,...` (a search's or a sweep's list)."""
    return tuple(dict.fromkeys(parse_pd(part) for part in str(text).split(",") if part.strip()))


@dataclass(frozen=True)
class Disaggregation:
    """A prefill pool of `prefill` replicas and a decode pool of `decode` replicas."""

    prefill: int
    decode: int
    prefill_gpu: str | None = None      # None: the deployment's --gpu
    prefill_tp: int | None = None       # None: the deployment's --tp
    decode_gpu: str | None = None
    decode_tp: int | None = None
    kv_link: str | None = None          # None: planner.catalog.links.DEFAULT_LINK
    prefill_set: tuple[tuple[str, str], ...] = ()      # (POOL_KEYS setting, value): the prefill pool's own
    decode_set: tuple[tuple[str, str], ...] = ()

    @property
    def ratio(self) -> str:
        return f"{self.prefill}:{self.decode}"

    def pools(self, base: Deployment) -> tuple[Deployment, Deployment]:
        """The prefill pool's deployment and the decode pool's: the base with each pool's GPU, TP and settings."""
        def pool(name: str, gpu: str | None, tp: int | None, settings: tuple[tuple[str, str], ...]) -> Deployment:
            own = {key: Deployment.parse_value(key, value) for key, value in settings}
            try:
                return base.replace(gpu=gpu or base.gpu, tp=tp or base.tp, **own)
            except ValueError as exc:           # a setting the pool's deployment refuses, said for the pool
                raise PlannerError(f"the {name} pool: {exc}") from None
        return (pool("prefill", self.prefill_gpu, self.prefill_tp, self.prefill_set),
                pool("decode", self.decode_gpu, self.decode_tp, self.decode_set))

    def gpus(self, base: Deployment) -> int:
        prefill, decode = self.pools(base)
        return self.prefill * prefill.gpus + self.decode * decode.gpus

    def check(self, base: Deployment, replicas: int = 1) -> None:
        """One line on a combination that makes no sense (see the module)."""
        for name in ("prefill", "decode"):
            count = getattr(self, name)
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise PlannerError(f"--pd {self.prefill}:{self.decode}: each pool needs at least one replica")
        for name in ("prefill_tp", "decode_tp"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise PlannerError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if replicas != 1:
            raise PlannerError(f"--pd {self.ratio} sets both pools' replicas: it replaces --replicas {replicas}")
        if base.policy != "vllm-v1":
            raise PlannerError(f"--pd {self.ratio} simulates vLLM v1's KV connector (disaggregated prefill is a "
                               f"vLLM v1 feature): give --policy vllm-v1, not {base.policy}")
        link = resolve_link(self.kv_link)
        if link.node_gpus is not None and self.gpus(base) > link.node_gpus:
            raise PlannerError(f"--kv-link {link.name} joins the GPUs of one node ({link.node_gpus}): --pd "
                               f"{self.ratio} needs {self.gpus(base)} GPUs; use --kv-link infiniband or ethernet")

    def flags(self) -> list[str]:
        """The command-line flags that rebuild it."""
        words = ["--pd", self.ratio]
        for name in PD_FLAGS:
            value = getattr(self, name)
            if value is not None:
                words += ["--" + name.replace("_", "-"), str(value)]
        for name in POOL_SETS:
            for key, value in getattr(self, name):
                words += ["--" + name.replace("_", "-"), f"{key}={value}"]
        return words
