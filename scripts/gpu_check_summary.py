"""Summarize a gpu_check.sh run folder into summary.json and summary.md, against issue 14's targets.

    python3 scripts/gpu_check_summary.py OUT_DIR [--dry-run]

Exit status 0 when every step ran (a dry run checks only that), 1 otherwise.
Targets are reported, not enforced by the exit status: a run that measures a
miss has still done its job.
"""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

TARGETS = {"paged decode bandwidth (MHA fp16, b64 c2048)": ">= 70% of 4.8 TB/s",
           "fp32 greedy parity": "exact", "bf16 greedy parity": "within tie tolerance",
           "validate throughput": "within +-3%", "validate E2E": "within +-5%"}


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def last_json_line(path: Path):
    """The JSON document a `--json` command printed (the last line that parses)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def validation(doc) -> dict | None:
    if not doc:
        return None
    comparison = doc.get("comparison", {})

    def error(name):
        row = comparison.get(name) or {}
        return row.get("relative_error")
    throughput = error("output_token_throughput") if error("output_token_throughput") is not None \
        else error("request_throughput")
    e2e = error("e2e_mean")
    return {"cost_model": doc.get("cost_model"), "kernels": doc.get("kernels"),
            "throughput_error": throughput, "e2e_error": e2e, "per_step_error": doc.get("per_step_error"),
            "throughput_within_3pct": throughput is not None and abs(throughput) <= 0.03,
            "e2e_within_5pct": e2e is not None and abs(e2e) <= 0.05}


def main() -> int:
    out = Path(sys.argv[1])
    dry = "--dry-run" in sys.argv[2:]
    steps = []
    for line in (out / "steps.tsv").read_text().splitlines():
        name, status, seconds = line.split("\t")
        steps.append({"step": name, "status": status, "seconds": int(seconds)})
    summary: dict = {"dry_run": dry, "steps": steps, "targets": TARGETS}
    tests = out / "gpu-tests.xml"
    if tests.exists():
        suite = ET.parse(tests).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        summary["gpu_tests"] = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    bandwidth = read_json(out / "decode_bandwidth.json")
    if bandwidth:
        summary["decode_bandwidth"] = {
            case: {k: bandwidth["cases"][case][k]["bandwidth_bytes_per_s"] / 1e12 for k in ("v1", "v2", "sdpa")}
            for case in bandwidth["cases"]}
        summary["decode_bandwidth"]["unit"] = "TB/s"
        summary["decode_bandwidth_target_met"] = bandwidth.get("target_met")
    parity = read_json(out / "parity.json")
    if parity:
        summary["parity"] = {r["dtype"]: {"identical": r["identical"], "sequences": r["sequences"],
                                          "passed": r["passed"]} for r in parity["results"]}
    summary["profiles"] = sorted(p.name for p in (out / "profiles").glob("*.json"))
    for log in sorted(out.glob("validate-*.log")) + sorted(out.glob("measured-cost-model-*.log")):
        summary[log.stem] = validation(last_json_line(log)) or log.read_text().strip().splitlines()[-1:] or None
    (out / "summary.json").write_text(json.dumps(summary, indent=2))

    lines = [f"# gpu_check {'(dry run, CPU)' if dry else ''}", "", "| step | status | seconds |", "|---|---|---:|"]
    lines += [f"| {s['step']} | {s['status']} | {s['seconds']} |" for s in steps]
    lines += ["", "```json", json.dumps({k: v for k, v in summary.items() if k not in ("steps",)}, indent=2), "```"]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:len(steps) + 4]))
    ran = all(s["status"] in ("0", "absent") for s in steps)
    return 0 if ran else 1


if __name__ == "__main__":
    sys.exit(main())
