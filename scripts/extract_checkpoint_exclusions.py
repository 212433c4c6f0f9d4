"""Record which modules NVIDIA's quantized checkpoints keep in 16 bits, for the catalog ids that name them.

NVIDIA's aiconfigurator-core (Apache-2.0) ships the config.json and hf_quant_config.json of the
checkpoints it models (model_configs/). A checkpoint named by its Hugging Face id (`--model
nvidia/DeepSeek-V3.2-NVFP4`) is planned from the catalog's shapes and the format its id names; this
script keeps, for every such id the catalog resolves, the `exclude_modules` of its hf_quant_config.json,
so the plan keeps those layers in 16 bits as the checkpoint does (planner/catalog/kept_layers.py).

Per-layer patterns of a module are folded to one `model.layers.*.` pattern wherever that leaves what the planner
reads unchanged (checked per id), so the file stays short. Checkpoints whose hf_quant_config the planner
cannot read as one format (ModelOpt's MIXED_PRECISION) are skipped, with why.

Run (after unzipping the wheel as scripts/extract_measured_tables.py says):
    python scripts/extract_checkpoint_exclusions.py /tmp/aic/x
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from planner.catalog.kept_layers import kept_fractions
from planner.catalog.models import resolve_model
from planner.catalog.quantization import format_from_config
from planner.errors import PlannerError

PACKAGE = "aiconfigurator-core 0.12.0"
OUT = Path(__file__).resolve().parent.parent / "planner" / "data" / "checkpoint_exclusions.json"
_LAYER = re.compile(r"^(.*?layers\.)(\d+)([.*].*)$")


def folded(patterns: list[str], model) -> list[str]:
    """`patterns` with each per-layer family of a module (not whole layers: GLM-5.1 keeps its first two
    layers whole) replaced by one wildcard where the planner reads the same."""
    families: dict[tuple[str, str], list[str]] = {}
    for p in patterns:
        m = _LAYER.match(p)
        families.setdefault((m.group(1), m.group(3)) if m else (p, ""), []).append(p)
    want = kept_fractions(model, tuple(patterns))
    out = list(patterns)
    for (head, tail), members in families.items():
        if len(members) < 3 or not tail.strip(".*"):
            continue
        trial = [p for p in out if p not in members] + [f"{head}*{tail}"]
        if kept_fractions(model, tuple(trial)) == want:
            out = trial
    return sorted(out)


def main(root: str) -> None:
    configs = Path(root) / "aiconfigurator_core" / "model_configs"
    records, skipped = {}, {}
    for path in sorted(configs.glob("*_hf_quant_config.json")):
        model_id = path.name[:-len("_hf_quant_config.json")].replace("--", "/")
        try:
            model = resolve_model(model_id)
        except PlannerError:
            continue                                   # not a catalog id
        quant = json.loads(path.read_text())
        try:
            fmt = format_from_config(quant, source=path.name)
        except PlannerError as exc:
            skipped[model_id] = str(exc)
            continue
        patterns = folded(list(fmt.excluded), model)
        records[model_id] = {"exclude_modules": patterns, "format": fmt.method,
                             "source": f"{PACKAGE} model_configs/{path.name}"}
    OUT.write_text(json.dumps({"about": __doc__.split("\n\n")[0], "checkpoints": records, "skipped": skipped},
                              indent=1) + "\n")
    print(f"wrote {OUT} ({len(records)} checkpoints, {len(skipped)} skipped)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/extract_checkpoint_exclusions.py <unzipped aiconfigurator-core wheel>")
    main(sys.argv[1])
