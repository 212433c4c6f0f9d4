"""Extract the vLLM op tables the `measured` cost model reads from an aiconfigurator-core wheel.

NVIDIA's aiconfigurator-core (Apache-2.0) ships per-GPU parquet tables of
measured vLLM operation latencies. The package is ~80 MB and pulls scipy and
pyarrow; the planner needs ~1% of it. This script keeps exactly the rows the
cost model uses (no sliding window, the attention kernel vLLM picks by default
on that GPU), writes them as gzip CSV under planner/data/measured/<system>/,
and records where each came from (package version, file, sha256, the vLLM
version) in planner/data/measured/SOURCE.json:
- GEMMs per weight format: `gemm` (bf16), `gemm_fp8` (per-tensor FP8 W8A8,
  CUTLASS scaled-mm), `gemm_nvfp4` (NVFP4 W4A4), each where the system's
  table measured it over the full grid (a format measured on a few shapes
  only is recorded as skipped, with its row count). The 128x128 block-scaled
  FP8 rows are skipped, with why: every GPU's are flat at 58-340 us from
  m = 1 to m = 4096 (n 2048, k 3072), a per-call cost of their eager timing
  that vLLM's CUDA graphs do not pay; the cost model prices block-scaled
  weights with `gemm_fp8`, the same FP8 tensor-core GEMM;
- MoE (`moe`): one MoE layer's fused experts (vLLM's FusedMoE, dispatch and combine excluded) per
  expert format, by tokens, TP/EP split (each with the kernel vLLM selects for it) and routing
  distribution, for the catalog's MoE shapes only;
- attention per KV-cache dtype: `context_attention` / `generation_attention`
  (bf16 cache) and `context_attention_fp8kv` / `generation_attention_fp8kv`
  (FP8 cache, bf16 queries), each with the kernel vLLM selects for that cache:
  FlashAttention 3 on Hopper, FlashInfer where FlashAttention 2 takes no FP8
  cache (Ada, Blackwell RTX), TRT-LLM-gen kernels through FlashInfer on B200;
- Gated DeltaNet (`gdn`): one linear-attention layer's two kernels per phase (the short
  conv and the delta rule), by the heads on one GPU, batch and sequence length;
- DeepSeek Sparse Attention (`dsa_context`, `dsa_generation`): one layer's whole attention module
  (projections, indexer, sparse MLA, o_proj) per model shape (DeepSeek-V3.2, GLM-5), heads on one
  GPU, KV-cache dtype and GEMM format, by batch and prompt length (fresh prompts) or context;
- multi-head latent attention (`mla_context`, `mla_generation`): one DeepSeek-V3 layer's whole MLA module
  (q_a + kv_a, q_b, kv_b, o, the latent norms, rotary, cache write and attention) by heads on one GPU,
  KV-cache dtype and GEMM format, by batch and prompt length (fresh prompts) or context, with the
  attention kernels vLLM runs by default (16-bit prefill attention);
- DeepSeek-V4 (`dsv4_context`, `dsv4_generation`): one CSA or HCA layer's whole attention module
  (projections, compressors, indexer, sparse attention, output projections) per model shape and heads on
  one GPU, by batch and context (decode) or prompt length and cached prefix (prefill); and its
  hyper-connections (`mhc`): the mHC pre and post kernels of one layer, by tokens.

Run (needs pandas, pyarrow and pyyaml, only here; the planner reads the CSVs
with the standard library):
    pip install pandas pyarrow pyyaml
    pip download --no-deps aiconfigurator-core==0.12.0 -d /tmp/aic
    unzip -q /tmp/aic/aiconfigurator_core-0.12.0-*.whl -d /tmp/aic/x
    python scripts/extract_measured_tables.py /tmp/aic/x
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pandas as pd
import yaml

SYSTEMS = ("a100_sxm", "h100_sxm", "h200_sxm", "l40s", "rtx_pro_6000_server", "b200_sxm", "b300_sxm", "gb200", "gb300")
# The attention backend vLLM selects by default per architecture, best first.
# FlashAttention 3 has no 512-wide heads (Gemma 4's full layers): NVIDIA timed those with FlashAttention 4 on
# Hopper; a kernel is chosen per head size.
KERNELS = {
    "context": ("vllm_flash_attn_fa3", "vllm_flash_attn_fa4", "vllm_flash_attn_fa2", "vllm_flash_attn",
                "vllm_flashinfer_trtllmprefill"),
    "generation": ("vllm_flash_attn_fa3", "vllm_flash_attn_fa4", "vllm_flash_attn_fa2", "vllm_flash_attn",
                   "vllm_flashinfer_trtllmdecode"),
}
# With an FP8 cache: vLLM's FlashAttention backend takes one only as FA3 on Hopper
# (vllm/attention/utils/fa_utils.py flash_attn_supports_fp8), so elsewhere it selects FlashInfer.
KERNELS_FP8KV = {
    "context": ("vllm_flash_attn_fa3", "vllm_flashinfer_trtllmprefill", "vllm_flashinfer_fiprefill",
                "vllm_flashinfer"),
    "generation": ("vllm_flash_attn_fa3", "vllm_flashinfer_trtllmdecode", "vllm_flashinfer_fidecode",
                   "vllm_flashinfer"),
}
# GEMM tables by weight format: the file's gemm_dtype, and our table name.
GEMM_FORMATS = {"bfloat16": "gemm", "fp8": "gemm_fp8", "nvfp4": "gemm_nvfp4"}
# Formats whose rows do not time the GPU's work, and why (kept out of the tables, recorded as skipped).
NOT_GPU_TIME = {"fp8_block": ("gemm_fp8_block", "flat from m = 1 to 4096 (H100: 58-101 us at n 2048, k 3072, "
                              "where the per-tensor FP8 GEMM takes 8-84 us): a per-call cost of timing the "
                              "block-scaled kernels eagerly, which vLLM's CUDA graphs do not pay; block-scaled "
                              "weights are priced with gemm_fp8")}
# A format measured on fewer rows than this share of the bf16 grid is too sparse to interpolate.
MIN_GRID_SHARE = 0.5
OUT = Path(__file__).resolve().parent.parent / "planner" / "data" / "measured"


def _version_key(v: str) -> tuple:
    return tuple(int(p) if p.isdigit() else -1 for p in v.replace("dev", ".").split("."))


def newest(folder: Path, filename: str) -> Path | None:
    """The newest version folder under `folder` that holds `filename`."""
    if not folder.is_dir():
        return None
    found = [d for d in folder.iterdir() if (d / filename).is_file()]
    return max(found, key=lambda d: _version_key(d.name)) / filename if found else None


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write(df: pd.DataFrame, system: str, name: str) -> None:
    path = OUT / system / f"{name}.csv.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False, float_format="%.6g", compression={"method": "gzip", "mtime": 0})


def source(base: Path, path: Path, **extra) -> dict:
    """Where a table came from: its file in the package, its sha256, and the
    framework and version folders it sits in; plus what was kept of it."""
    return {"file": str(path.relative_to(base)), "sha256": sha256(path),
            "framework": path.parent.parent.name, "version": path.parent.name, **extra}


def extract_gemm(data: Path, base: Path, system: str) -> tuple[dict, dict, str]:
    """The GEMM tables, one per weight format the system measured over the full grid (median latency
    per m, n, k); their sources, the formats skipped (with why) and the device they were measured on."""
    path = newest(data / "gemm" / "vllm", "gemm_perf.parquet")
    g = pd.read_parquet(path)
    full = int((g.gemm_dtype == "bfloat16").sum())
    sources, skipped = {}, {}
    for dtype, name in {**GEMM_FORMATS, **{d: name for d, (name, _) in NOT_GPU_TIME.items()}}.items():
        rows = g[g.gemm_dtype == dtype]
        if dtype in NOT_GPU_TIME and len(rows) >= MIN_GRID_SHARE * full:
            skipped[name] = NOT_GPU_TIME[dtype][1]
            continue
        if len(rows) < MIN_GRID_SHARE * full:
            if len(rows):
                skipped[name] = (f"{len(rows)} rows of gemm_dtype={dtype} against {full} of bfloat16: "
                                 f"{rows.n.nunique()} n x {rows.k.nunique()} k values, too sparse to interpolate")
            continue
        table = rows.groupby(["m", "n", "k"], as_index=False).latency.median()
        write(table.rename(columns={"latency": "latency_ms"}), system, name)
        kernels = sorted(rows.kernel_source.unique())
        sources[name] = source(base, path, rows=len(table), kernel=", ".join(kernels), filter=f"gemm_dtype={dtype}")
    return sources, skipped, str(g.device.iloc[0])


def extract_attention(data: Path, base: Path, system: str, op: str, kv_dtype: str = "bfloat16") -> dict:
    """The ``op`` (context or generation) attention table for a ``kv_dtype`` (bfloat16 or fp8) cache,
    of the kernel vLLM picks for it at each head size: bf16 queries, no sliding window, median of repeats.
    Returns its source."""
    path = newest(data / "attention" / "vllm", f"{op}_attention_perf.parquet")
    a = pd.read_parquet(path)
    a = a[(a.kv_cache_dtype == kv_dtype) & (a.attn_dtype == "bfloat16")]
    if "window_size" in a.columns:
        a = a[a.window_size == 0]
    preference = KERNELS if kv_dtype == "bfloat16" else KERNELS_FP8KV
    chosen = {}
    for head_dim in sorted(a.head_dim.unique()):
        found = set(a.kernel_source[a.head_dim == head_dim])
        kernel = next((k for k in preference[op] if k in found), None)
        if kernel is not None:
            chosen.setdefault(kernel, []).append(int(head_dim))
    if not chosen:
        return {}
    a = a[[chosen.get(k) is not None and h in chosen[k] for k, h in zip(a.kernel_source, a.head_dim)]]
    kernel = ", ".join(k if len(chosen) == 1 else f"{k} (head_dim {', '.join(map(str, dims))})"
                       for k, dims in chosen.items())
    keys = ["batch_size", "isl" if op == "context" else "step", "num_heads", "num_key_value_heads", "head_dim"]
    a = a.groupby(keys, as_index=False).latency.median()
    a = a.rename(columns={"latency": "latency_ms", "num_key_value_heads": "num_kv_heads"})
    name = f"{op}_attention" + ("" if kv_dtype == "bfloat16" else "_fp8kv")
    write(a, system, name)
    return {name: source(base, path, rows=len(a), kernel=kernel,
                         filter=f"attn_dtype=bfloat16, kv_cache_dtype={kv_dtype}, window_size=0, "
                                f"median of repeats")}


def extract_allreduce(data: Path, base: Path, system: str) -> dict:
    """One all-reduce table from vLLM's custom all-reduce and NCCL's (bf16/half,
    median per backend, GPU count and message size). Returns the sources by name."""
    frames, sources = [], {}
    custom = newest(data / "comm" / "vllm", "custom_allreduce_perf.parquet")
    if custom is not None:
        c = pd.read_parquet(custom)
        c = c[c.allreduce_dtype == "bfloat16"]
        c = c.assign(backend=c.backend.str.replace("vllm_", "custom_", regex=False))
        frames.append(c[["backend", "num_gpus", "message_size", "latency"]])
        sources["custom_allreduce"] = source(base, custom, rows=len(c),
                                             filter="allreduce_dtype=bfloat16; message_size in elements")
    nccl = newest(data / "comm" / "nccl", "nccl_perf.parquet")
    if nccl is not None:
        n = pd.read_parquet(nccl)
        n = n[(n.op_name == "all_reduce") & (n.nccl_dtype == "half")].assign(backend="nccl")
        frames.append(n[["backend", "num_gpus", "message_size", "latency"]])
        sources["nccl_allreduce"] = source(base, nccl, rows=len(n),
                                           filter="op_name=all_reduce, nccl_dtype=half; message_size in elements")
    ar = pd.concat(frames).groupby(["backend", "num_gpus", "message_size"], as_index=False).latency.median()
    write(ar.rename(columns={"latency": "latency_ms"}), system, "allreduce")
    return sources


# MoE: NVIDIA's collector times each model's experts at each TP/EP split with the kernel vLLM selects for them
# (on Hopper block FP8 runs Triton split by width and FlashInfer CUTLASS under expert parallelism:
# vllm/model_executor/layers/fused_moe/oracle/fp8.py _get_priority_backends, "On Hopper for Block Fp8, prefer
# Triton for TP and FI CUTLASS for EP"; on B200 Nemotron 3 Super's FP8 experts run TRT-LLM's kernel and Gemma
# 4's GELU ones CUTLASS's). The kernel is chosen per shape and split; should one hold several, the first of
# these (substrings of kernel_source) is kept: gpt-oss's own MXFP4 kernel, then Triton, FlashInfer, Marlin.
MOE_KERNELS = ("gptoss", "triton", "flashinfer", "marlin")
# Routing distributions kept: balanced (every expert equally likely) and NVIDIA's power-law skew with
# exponent 1.2 (aiconfigurator's default for MoE models); power_law_1.01 sits between them.
MOE_DISTRIBUTIONS = ("balanced", "power_law_1.01", "power_law_1.2")


def catalog_moe_shapes() -> set[tuple[int, int, int, int]]:
    """(hidden, expert width, top-k, experts) of the catalog's MoE models: the only rows kept (the experts'
    hidden is Nemotron-H's latent where it has one)."""
    models = json.loads((OUT.parent / "models.json").read_text())["models"]
    return {(m.get("moe_latent_size") or m["hidden_size"], m["moe_intermediate_size"], m["num_experts_per_tok"],
             m["num_experts"]) for m in models if m.get("num_experts")}


def catalog_model_ids() -> set[str]:
    """The Hugging Face ids and names of the catalog's models: a module table's rows of other models (a
    system's newer timings, e.g. GB300's Kimi-K3) would name a model the planner cannot resolve."""
    models = json.loads((OUT.parent / "models.json").read_text())["models"]
    return {name for m in models for name in (m.get("hf_id"), m["name"], *m.get("aliases", ())) if name}


def _splits(pairs: set[tuple[int, int]]) -> str:
    """The TP/EP splits a kernel was timed at, as `moe_tp 1-16` and `EP 2-256`."""
    tp = sorted(t for t, e in pairs if e == 1)
    ep = sorted(e for t, e in pairs if e > 1)
    return ", ".join(f"{name} {min(v)}-{max(v)}" for name, v in (("moe_tp", tp), ("EP", ep)) if v)


def extract_moe(data: Path, base: Path, system: str) -> dict:
    """The fused-MoE table (one MoE layer's experts on one GPU: tokens, expert format, TP/EP split,
    routing distribution) for the catalog's MoE shapes, each split with its kernel; its source."""
    path = newest(data / "moe" / "vllm", "moe_perf.parquet")
    if path is None:
        return {}
    m = pd.read_parquet(path)
    shapes = catalog_moe_shapes()
    keep = pd.Series([(h, i, k, e) in shapes for h, i, k, e in zip(m.hidden_size, m.inter_size, m.topk,
                                                                    m.num_experts)], index=m.index)
    m = m[keep & m.distribution.isin(MOE_DISTRIBUTIONS)]
    frames, kernels = [], {}
    shape = ["hidden_size", "inter_size", "topk", "num_experts"]
    for (dtype, *_, tp, ep), rows in m.groupby(["moe_dtype", *shape, "moe_tp_size", "moe_ep_size"]):
        found = sorted(rows.kernel_source.unique())
        kernel = next((k for pref in MOE_KERNELS for k in found if pref in k), found[0])
        kernels.setdefault(dtype, {}).setdefault(kernel, set()).add((int(tp), int(ep)))
        frames.append(rows[rows.kernel_source == kernel])
    keys = ["moe_dtype", "hidden_size", "inter_size", "topk", "num_experts", "distribution", "moe_tp_size",
            "moe_ep_size", "num_tokens"]
    table = pd.concat(frames).groupby(keys, as_index=False).latency.median()
    write(table.rename(columns={"latency": "latency_ms"}), system, "moe")
    named = "; ".join(f"{d}: " + ", ".join(f"{k} ({_splits(pairs)})" for k, pairs in by_kernel.items())
                      for d, by_kernel in kernels.items())
    return {"moe": source(base, path, rows=len(table), kernel=named,
                          filter=f"the catalog's MoE shapes (hidden, inter_size, topk, num_experts) "
                                 f"{sorted(shapes)}; distribution in {list(MOE_DISTRIBUTIONS)}; the kernel "
                                 f"each TP/EP split was timed with; median of repeats")}


# GDN (linear attention): the collector times each phase's two kernels apart; the table names them by role,
# since the delta rule's kernel differs by GPU (FlashInfer's chunked one on Hopper and B200, Triton's on
# Ada and Blackwell RTX) and the cost model sums the two either way.
GDN_ROLES = (("conv1d", "conv"), ("gated_delta_rule", "delta_rule"))
GDN_SHAPE = ["num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim"]


def _gdn_role(kernel_source: str) -> str:
    role = next((short for part, short in GDN_ROLES if part in kernel_source), None)
    if role is None:
        raise SystemExit(f"gdn_perf: kernel {kernel_source!r} is neither the conv nor the delta rule")
    return role


def extract_gdn(data: Path, base: Path, system: str) -> dict:
    """The Gated DeltaNet table (one layer's conv and delta-rule kernels on one GPU, per phase, by the
    heads on that GPU, batch_size and seq_len; seq_len 1 when decoding); its source. d_model is dropped:
    the kernels never see it, and models sharing a head shape at different d_model time the same (per
    shape and kernel, each model's geometric mean within 1.6% of the shape's median), so their median
    is kept."""
    path = newest(data / "linear_attention" / "vllm", "gdn_perf.parquet")
    if path is None:
        return {}
    g = pd.read_parquet(path)
    g = g[g.d_conv == 4]                # Qwen3.5's and Qwen3-Next's conv width, the only one timed
    g = g.assign(kernel=g.kernel_source.map(_gdn_role))
    pairs = g.groupby(["phase", "kernel"]).kernel_source.unique()
    if any(len(found) > 1 for found in pairs):
        raise SystemExit(f"gdn_perf: several kernels time one role: {pairs.to_dict()}")
    keys = ["kernel", "phase", *GDN_SHAPE, "batch_size", "seq_len"]
    table = g.groupby(keys, as_index=False).latency.median()
    write(table.rename(columns={"latency": "latency_ms"}), system, "gdn")
    named = "; ".join(f"{phase} {role}: {found[0]}" for (phase, role), found in pairs.items())
    return {"gdn": source(base, path, rows=len(table), kernel=named,
                          filter="d_conv=4; num_k_heads and num_v_heads are the heads on one GPU; "
                                 "median over the models (d_model) sharing a head shape, and of repeats")}


# The attention-module tables NVIDIA timed whole (projections, small kernels and attention of one layer), by
# their folder under systems/data/<system>: DeepSeek Sparse Attention's and multi-head latent attention's.
MODULE_FOLDERS = {"dsa": "sparse_attention", "mla": "mla"}


def extract_modules(data: Path, base: Path, system: str) -> dict:
    """The DSA and MLA module tables (decode by cached tokens `step`, prefill by prompt length `isl` over no
    cached prefix), the median of repeats; their sources. Each (cache dtype, GEMM format, heads) is timed with
    the kernels vLLM picks for it. DSA on B200: FlashInfer's for an FP8 cache or at most 16 heads, FlashMLA's
    otherwise. MLA on Hopper: the decode backend (FlashAttention's MLA with a 16-bit cache, FlashMLA with an
    FP8 one) and, for prompts past its query threshold, FlashAttention's prefill; on B200 FlashInfer's MLA.
    B200's FP8-cache MLA prefill is also timed with an FP8 TRT-LLM ragged kernel, which vLLM runs only when
    use_trtllm_ragged_deepseek_prefill is set: its rows (mla_dtype fp8) are left out."""
    found = {}
    for kind, folder in MODULE_FOLDERS.items():
        for phase, length in (("context", "isl"), ("generation", "step")):
            path = newest(data / folder / "vllm", f"{kind}_{phase}_module_perf.parquet")
            if path is None:
                continue
            d = pd.read_parquet(path)
            d = d[(d.mla_dtype == "bfloat16") & d.model.isin(catalog_model_ids())]
            if phase == "context":
                d = d[d.step == 0]
            keys = ["model", "num_heads", "kv_cache_dtype", "gemm_type", "batch_size", length]
            if d.groupby(keys).kernel_source.nunique().max() != 1:
                raise SystemExit(f"{kind}_{phase}_module_perf: several kernels time one point")
            kernels = d.groupby("kv_cache_dtype").kernel_source.unique()
            named = "; ".join(f"{kv} cache: {'/'.join(sorted(found))}" for kv, found in kernels.items())
            table = d.groupby(keys, as_index=False).latency.median()
            write(table.rename(columns={"latency": "latency_ms"}), system, f"{kind}_{phase}")
            found[f"{kind}_{phase}"] = source(
                base, path, rows=len(table), kernel=named,
                filter=("step=0 (no cached prefix); " if phase == "context" else "")
                + "mla_dtype=bfloat16; the catalog's models; num_heads are the heads on one GPU; median of repeats")
    return found


def extract_dsv4(data: Path, base: Path, system: str) -> dict:
    """DeepSeek-V4's attention module tables (CSA and HCA layers in one table, by `compress_ratio`): decode by
    cached tokens `step`, prefill by prompt length `isl` and cached prefix `step`; the median of repeats."""
    found = {}
    for phase, keys in (("context", ["isl", "step"]), ("generation", ["step"])):
        parts = [newest(data / "sparse_attention" / "vllm", f"dsv4_{kind}_{phase}_module_perf.parquet")
                 for kind in ("csa", "hca")]
        if None in parts:
            continue
        d = pd.concat([pd.read_parquet(path) for path in parts])
        fixed = d[["kernel_source", "mla_dtype", "kv_cache_dtype", "gemm_type"]].drop_duplicates()
        if len(fixed) != 1:
            raise SystemExit(f"dsv4_{phase} module tables: several kernels or dtypes time one module: {fixed}")
        kernel, mla, kv, gemm = fixed.iloc[0]
        table = d.groupby(["model", "num_heads", "compress_ratio", "batch_size", *keys],
                          as_index=False).latency.median()
        write(table.rename(columns={"latency": "latency_ms"}), system, f"dsv4_{phase}")
        found[f"dsv4_{phase}"] = source(
            base, parts[0], rows=len(table), kernel=kernel, also=str(parts[1].relative_to(base)),
            also_sha256=sha256(parts[1]),
            filter=f"mla_dtype={mla}; kv_cache_dtype={kv}; gemm_type={gemm}; num_heads are the heads on one GPU; "
                   + ("step is the cached prefix; " if phase == "context" else "step is the cached tokens; ")
                   + "median of repeats")
    return found


def extract_mhc(data: Path, base: Path, system: str) -> dict:
    """DeepSeek-V4's hyper-connection kernels (mHC pre and post, as `kernel`) by hidden size and tokens."""
    path = newest(data / "mhc" / "vllm", "mhc_module_perf.parquet")
    if path is None:
        return {}
    d = pd.read_parquet(path)
    fixed = d[["num_sites", "sinkhorn_iters"]].drop_duplicates()
    if len(fixed) != 1 or d.groupby("op_name").kernel_source.nunique().max() != 1:
        raise SystemExit(f"mhc_module_perf: several site counts, Sinkhorn iterations or kernels: {fixed}")
    sites, iters = fixed.iloc[0]
    table = (d.rename(columns={"op_name": "kernel"})
             .groupby(["kernel", "hc_mult", "hidden_size", "num_tokens"], as_index=False).latency.median())
    write(table.rename(columns={"latency": "latency_ms"}), system, "mhc")
    kernels = "; ".join(f"{op}: {k}" for op, k in d.groupby("op_name").kernel_source.first().items())
    return {"mhc": source(base, path, rows=len(table), kernel=kernels,
                          filter=f"num_sites={sites}; sinkhorn_iters={iters}; median of repeats")}


def system_spec(spec_path: Path, system: str) -> dict:
    """The GPU and node figures of the system's spec file the cost model reads."""
    spec = yaml.safe_load(spec_path.read_text())
    gpu, node, misc = spec["gpu"], spec["node"], spec.get("misc", {})
    return {
        "file": f"systems/{system}.yaml", "sha256": sha256(spec_path),
        "mem_bw": gpu["mem_bw"], "mem_bw_empirical_scaling_factor": gpu.get("mem_bw_empirical_scaling_factor"),
        "mem_empirical_constant_latency": gpu.get("mem_empirical_constant_latency"),
        "mem_capacity": gpu["mem_capacity"], "bfloat16_tc_flops": gpu.get("bfloat16_tc_flops"),
        "fp8_tc_flops": gpu.get("fp8_tc_flops"), "fp4_tc_flops": gpu.get("fp4_tc_flops"),
        "intra_node_bw": node.get("intra_node_bw"), "num_gpus_per_node": node.get("num_gpus_per_node"),
        "nccl_mem": {str(k): v for k, v in (misc.get("nccl_mem") or {}).items()},
    }


def extract(root: Path, system: str, package_version: str) -> dict:
    """Writes the system's tables; returns their record for SOURCE.json."""
    base = root / "aiconfigurator_core"
    data = base / "systems" / "data" / system
    spec = system_spec(base / "systems" / f"{system}.yaml", system)
    tables, skipped, device = extract_gemm(data, base, system)
    for kv_dtype in ("bfloat16", "fp8"):
        for op in ("context", "generation"):
            tables.update(extract_attention(data, base, system, op, kv_dtype))
    tables.update(extract_allreduce(data, base, system))
    tables.update(extract_moe(data, base, system))
    tables.update(extract_gdn(data, base, system))
    tables.update(extract_modules(data, base, system))
    tables.update(extract_dsv4(data, base, system))
    tables.update(extract_mhc(data, base, system))
    record = {"tables": tables, "device": device, "spec": spec}
    if skipped:
        record["skipped"] = skipped
    return record


def main(root: str) -> None:
    root_path = Path(root)
    meta = next(root_path.glob("aiconfigurator_core-*.dist-info/METADATA")).read_text()
    version = next(line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Version:"))
    doc = {
        "package": "aiconfigurator-core", "package_version": version, "license": "Apache-2.0",
        "copyright": "Copyright (c) 2025-2026 NVIDIA CORPORATION & AFFILIATES",
        "url": "https://pypi.org/project/aiconfigurator-core/",
        "units": "latency_ms: milliseconds; message_size: elements (bf16); m: tokens; n, k: GEMM output and input width",
        "systems": {s: extract(root_path, s, version) for s in SYSTEMS},
    }
    (OUT / "SOURCE.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {OUT} from aiconfigurator-core {version}")


if __name__ == "__main__":
    main(sys.argv[1])
