"""Every result file carries schema_version, and docs/results.md documents every field it writes."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.deployment import Deployment
from planner import capacity, search, simulate, sweep
from planner.api import run_spec
from planner.documents import SCHEMA_VERSION
from planner.report.sweep import sweep_document

DOCUMENTED = set(re.findall(r"`([a-z_0-9]+)`", (Path(__file__).parent.parent / "docs" / "results.md").read_text()))
NESTED = ("params", "memory_plan", "steady_state", "verdict", "deployment", "profile_check", "window", "queue",
          "at_capacity_summary", "best", "spec_decoding_stats", "fleet", "kv_offload")


def undocumented(doc: dict, where: str = "") -> list[str]:
    """Keys of `doc` (and of its documented sub-objects) that docs/results.md does not name."""
    missing = [f"{where}{key}" for key in doc if key not in DOCUMENTED]
    for key in NESTED:
        if isinstance(doc.get(key), dict):
            missing += undocumented(doc[key], f"{where}{key}.")
    return missing


@pytest.fixture(scope="module")
def small():
    return Deployment(model="opt-1.3b", gpu="a100-40g")


def test_result_json(small):
    doc = simulate(small, workload="alpaca", rate=4, requests=60, slos={"ttft_p99": 1}).document()
    assert doc["schema_version"] == SCHEMA_VERSION
    assert not undocumented(doc)


def test_a_run_with_a_cpu_kv_tier_and_offloaded_weights_documents_its_fields(small):
    doc = simulate(small.replace(kv_offloading_size=8.0, cpu_offload_gb=1.0), workload="chatbot", rate=4,
                   requests=60).document()
    assert doc["kv_offload"]["blocks_stored"] > 0
    assert doc["memory_plan"]["cpu_offload_gib_per_gpu"] == 1.0
    assert not undocumented(doc)


def test_a_speculating_fleet_documents_its_fields(small):
    from planner.runs.spec import Fleet

    spec = run_spec(small.replace(speculative="eagle:2"), workload="alpaca", rate=4, requests=40)
    doc = simulate(spec.__class__(**{**spec.__dict__, "fleet": Fleet(2, "least-requests")})).document()
    assert doc["spec_decoding_stats"]["num_drafts"] > 0 and doc["fleet"]["replicas"] == 2
    assert not undocumented(doc)
    for row in doc["fleet"]["per_replica"]:
        assert not undocumented(row)


def test_sweep_capacity_and_search_json(small):
    specs = [run_spec(small, workload="alpaca", rate=r, requests=40) for r in (2, 4)]
    docs = sweep(specs)
    for doc in (sweep_document(docs), capacity(small, slos="ttft_p99=2", requests=40, tolerance=0.2).document,
                capacity(small, slos="ttft_p99=2", slo_attainment=0.9, requests=40, tolerance=0.2).document,
                search(small, slos="ttft_p99=2", requests=40, tolerance=0.2, rate=2, workers=1).document()):
        assert doc["schema_version"] == SCHEMA_VERSION
        assert not undocumented(doc)
    for row in search(small, slos="ttft_p99=2", requests=40, tolerance=0.2, workers=1).configs:
        assert not undocumented(row)
