"""Record the weight format of the quantized checkpoints the catalog's ids name, as their configs declare it.

NVIDIA's aiconfigurator-core (Apache-2.0) ships the config.json and hf_quant_config.json of the
checkpoints it models (model_configs/). A checkpoint named by its Hugging Face id (`--model
nvidia/DeepSeek-V3.2-NVFP4`, `Qwen/Qwen3-30B-A3B-FP8`) is planned from the catalog's shapes; without a
record its format is guessed from the id's words (`-FP8`: vLLM's per-tensor FP8). This script keeps, for
every such id the catalog resolves, the format its config declares (Qwen's and Z.ai's FP8 releases are
128 x 128 block-scaled) and the modules it leaves unquantized, so the plan stores and prices the
checkpoint as vLLM loads it (planner/catalog/kept_layers.py).

Per-layer patterns of a module are folded to one `model.layers.*.` pattern wherever that leaves what the planner
reads unchanged (checked per id), so the file stays short. Checkpoints whose hf_quant_config the planner
cannot read are skipped, with why; ModelOpt's MIXED_PRECISION ones keep their quantized_layers, folded the same way.

Run (after unzipping the wheel as scripts/extract_measured_tables.py says):
    python scripts/extract_checkpoint_formats.py /tmp/aic/x
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path

from planner.catalog.kept_layers import format_shares, kept_fractions
from planner.catalog.models import resolve_model
from planner.catalog.quantization import format_from_config, mixed_format, with_expert_dtype
from planner.errors import PlannerError

PACKAGE = "aiconfigurator-core 0.12.0"
OUT = Path(__file__).resolve().parent.parent / "planner" / "data" / "checkpoint_formats.json"
_LAYER = re.compile(r"^(.*?layers\.)(\d+)([.*].*)$")


def folded(patterns: list[tuple[str, str]], reads) -> list[tuple[str, str]]:
    """`patterns` ((module name or pattern, what it says) pairs) with each per-layer family of a module saying
    one thing (not whole layers: GLM-5.1 keeps its first two layers whole) replaced by one wildcard where what
    the planner reads of them, `reads(pairs)`, stays the same."""
    families: dict[tuple[str, str, str], list[tuple[str, str]]] = {}
    for name, says in patterns:
        m = _LAYER.match(name)
        families.setdefault((m.group(1), m.group(3), says) if m else (name, "", says), []).append((name, says))
    want = reads(patterns)
    out = list(patterns)
    for (head, tail, says), members in families.items():
        if len(members) < 3 or not tail.strip(".*"):
            continue
        trial = [p for p in out if p not in members] + [(f"{head}*{tail}", says)]
        if reads(trial) == want:
            out = trial
    return sorted(out)


def folded_exclusions(fmt, model) -> list[str]:
    """The modules the checkpoint keeps in 16 bits, folded."""
    return [name for name, _ in folded([(p, "") for p in fmt.excluded],
                                       lambda pairs: kept_fractions(model, tuple(p for p, _ in pairs)))]


def folded_layers(qc: dict, fmt, model) -> dict[str, dict]:
    """A mixed checkpoint's quantized_layers, folded where the formats the planner reads stay the same."""
    listed = (qc.get("quantization") or qc).get("quantized_layers")

    def reads(pairs):
        layers = mixed_format({name: json.loads(says) for name, says in pairs}, fmt.source)
        mixed = replace(fmt, layers=layers.layers)
        return format_shares(model, mixed), mixed.experts, mixed.head

    pairs = folded([(name, json.dumps(entry, sort_keys=True)) for name, entry in listed.items()], reads)
    return {name: json.loads(says) for name, says in pairs}


def declared(configs: Path, stem: str) -> tuple[dict, str] | None:
    """(the quantization config a checkpoint declares, the file it is in), or None for a 16-bit one: config.json's
    quantization_config where it has one, as vLLM and planner/catalog/quantization.py checkpoint_format read it,
    else ModelOpt's hf_quant_config.json."""
    config = json.loads((configs / f"{stem}_config.json").read_text())
    qc = config.get("quantization_config") or (config.get("text_config") or {}).get("quantization_config")
    qc = with_expert_dtype(qc, config.get("expert_dtype"))
    if qc:
        return qc, f"{stem}_config.json"
    quant = configs / f"{stem}_hf_quant_config.json"
    return (json.loads(quant.read_text()), quant.name) if quant.exists() else None


def main(root: str) -> None:
    configs = Path(root) / "aiconfigurator_core" / "model_configs"
    records, skipped = {}, {}
    for path in sorted(configs.glob("*_config.json")):
        stem = path.name[:-len("_config.json")]
        if stem.endswith("_hf_quant"):
            continue
        model_id = stem.replace("--", "/")
        try:
            model = resolve_model(model_id)
        except PlannerError:
            continue                                   # not a catalog id
        found = declared(configs, stem)
        if found is None:
            continue
        qc, file = found
        try:
            fmt = format_from_config(qc, source=file)
        except PlannerError as exc:
            skipped[model_id] = str(exc)
            continue
        records[model_id] = {"method": fmt.method, "scheme": fmt.scheme, "bits": fmt.bits,
                             "group_size": fmt.group_size, "exclude_modules": folded_exclusions(fmt, model),
                             **({"expert_scheme": fmt.expert_scheme} if fmt.expert_scheme else {}),
                             **({"quantized_layers": folded_layers(qc, fmt, model)} if fmt.is_mixed else {}),
                             "source": f"{PACKAGE} model_configs/{file}"}
    OUT.write_text(json.dumps({"about": __doc__.split("\n\n")[0], "checkpoints": records, "skipped": skipped},
                              indent=1) + "\n")
    print(f"wrote {OUT} ({len(records)} checkpoints, {len(skipped)} skipped)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/extract_checkpoint_formats.py <unzipped aiconfigurator-core wheel>")
    main(sys.argv[1])
