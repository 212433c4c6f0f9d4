"""Extract the vLLM op tables the `measured` cost model reads from an aiconfigurator-core wheel.

NVIDIA's aiconfigurator-core (Apache-2.0) ships per-GPU parquet tables of
measured vLLM operation latencies. The package is ~80 MB and pulls scipy and
pyarrow; the planner needs ~1% of it. This script keeps exactly the rows the
cost model uses (bf16 weights and KV cache, no sliding window, the attention
kernel vLLM picks by default on that GPU), writes them as gzip CSV under
planner/data/measured/<system>/, and records where each came from (package
version, file, sha256, the vLLM version) in planner/data/measured/SOURCE.json.

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

SYSTEMS = ("a100_sxm", "h100_sxm", "h200_sxm", "l40s", "rtx_pro_6000_server", "b200_sxm")
# The attention backend vLLM selects by default per architecture, best first.
KERNELS = {
    "context": ("vllm_flash_attn_fa3", "vllm_flash_attn_fa2", "vllm_flash_attn", "vllm_flashinfer_trtllmprefill"),
    "generation": ("vllm_flash_attn_fa3", "vllm_flash_attn_fa2", "vllm_flash_attn", "vllm_flashinfer_trtllmdecode"),
}
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


def extract_gemm(data: Path, base: Path, system: str) -> tuple[dict, str]:
    """The bf16 GEMM table (median latency per m, n, k); its source and the device it was measured on."""
    path = newest(data / "gemm" / "vllm", "gemm_perf.parquet")
    g = pd.read_parquet(path)
    g = g[g.gemm_dtype == "bfloat16"]
    g = g.groupby(["m", "n", "k"], as_index=False).latency.median().rename(columns={"latency": "latency_ms"})
    write(g, system, "gemm")
    device = str(pd.read_parquet(path).device.iloc[0])
    return source(base, path, rows=len(g), filter="gemm_dtype=bfloat16"), device


def extract_attention(data: Path, base: Path, system: str, op: str) -> dict:
    """The ``op`` (context or generation) attention table of the kernel vLLM picks by
    default: bf16, no sliding window, median of repeats. Returns its source."""
    path = newest(data / "attention" / "vllm", f"{op}_attention_perf.parquet")
    a = pd.read_parquet(path)
    a = a[(a.kv_cache_dtype == "bfloat16") & (a.attn_dtype == "bfloat16")]
    if "window_size" in a.columns:
        a = a[a.window_size == 0]
    kernel = next(k for k in KERNELS[op] if (a.kernel_source == k).any())
    a = a[a.kernel_source == kernel]
    keys = ["batch_size", "isl" if op == "context" else "step", "num_heads", "num_key_value_heads", "head_dim"]
    a = a.groupby(keys, as_index=False).latency.median()
    a = a.rename(columns={"latency": "latency_ms", "num_key_value_heads": "num_kv_heads"})
    write(a, system, f"{op}_attention")
    return source(base, path, rows=len(a), kernel=kernel,
                  filter="attn_dtype=kv_cache_dtype=bfloat16, window_size=0, median of repeats")


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


def system_spec(spec_path: Path, system: str) -> dict:
    """The GPU and node figures of the system's spec file the cost model reads."""
    spec = yaml.safe_load(spec_path.read_text())
    gpu, node, misc = spec["gpu"], spec["node"], spec.get("misc", {})
    return {
        "file": f"systems/{system}.yaml", "sha256": sha256(spec_path),
        "mem_bw": gpu["mem_bw"], "mem_bw_empirical_scaling_factor": gpu.get("mem_bw_empirical_scaling_factor"),
        "mem_empirical_constant_latency": gpu.get("mem_empirical_constant_latency"),
        "mem_capacity": gpu["mem_capacity"], "bfloat16_tc_flops": gpu.get("bfloat16_tc_flops"),
        "intra_node_bw": node.get("intra_node_bw"), "num_gpus_per_node": node.get("num_gpus_per_node"),
        "nccl_mem": {str(k): v for k, v in (misc.get("nccl_mem") or {}).items()},
    }


def extract(root: Path, system: str, package_version: str) -> dict:
    """Writes the system's tables; returns their record for SOURCE.json."""
    base = root / "aiconfigurator_core"
    data = base / "systems" / "data" / system
    spec = system_spec(base / "systems" / f"{system}.yaml", system)
    tables: dict = {}
    tables["gemm"], device = extract_gemm(data, base, system)
    for op in ("context", "generation"):
        tables[f"{op}_attention"] = extract_attention(data, base, system, op)
    tables.update(extract_allreduce(data, base, system))
    return {"tables": tables, "device": device, "spec": spec}


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
