"""report.html: self-contained (no network), and it really shows in headless Chromium.

Chromium comes from Debian's packages; scripts/test.sh installs it when
/usr/bin/chromium is missing. This test installs it too when it runs as root
with apt-get, and skips (saying why) only when that is impossible.
"""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli.app import app

runner = CliRunner()
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("chromium is not installed and cannot be (needs root and apt-get): "
                    "apt-get install -y chromium, or run scripts/test.sh as root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    done = subprocess.run("apt-get update -qq && apt-get install -y -qq chromium", shell=True, env=env,
                          capture_output=True, text=True, timeout=900)
    found = shutil.which("chromium")
    if not found:
        pytest.skip(f"chromium could not be installed with apt-get: {done.stderr.strip()[-300:]}")
    return found


def _render(html: Path, tmp_path: Path) -> str:
    """The DOM after load, as headless Chromium builds it from the file (fresh profile, no network)."""
    profile = tmp_path / f"chromium-profile-{html.parent.name}"
    result = subprocess.run([_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                             "--virtual-time-budget=5000", "--dump-dom", html.resolve().as_uri()],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def _embedded_pngs(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)]


def _self_contained(html: str) -> None:
    # Nothing fetched: no http(s) URL in any src/href, no external stylesheet or script.
    assert not re.search(r'(src|href)="(?!data:)[^"#]', html)
    assert "<link" not in html
    pngs = _embedded_pngs(html)
    assert pngs and all(p.startswith(b"\x89PNG\r\n\x1a\n") and len(p) > 1000 for p in pngs)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run")
    result = runner.invoke(app, ["simulate", "--workload", "sharegpt", "--requests", "60", "--rate", "3",
                                 "--slo", "ttft_p99=2", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    return out


def test_run_report_is_self_contained_and_complete(run_dir):
    html = (run_dir / "report.html").read_text()
    _self_contained(html)
    doc = json.loads((run_dir / "result.json").read_text())
    assert len(_embedded_pngs(html)) == 3            # timeline, latency CDFs, memory breakdown
    for text in ("Verdict", "Memory plan", "Steady window", "Queue, batch and KV cache over time",
                 "time to first token", "What the cost model does not capture", "opt-13b on 1 x a100-40g"):
        assert text in html
    assert doc["verdict"]["lines"][0].split(";")[0] in html
    assert doc["verdict"]["slos"]["ttft_p99"]["limit"] == 2


def test_run_report_shows_in_headless_chromium(run_dir, tmp_path):
    dom = _render(run_dir / "report.html", tmp_path)
    doc = json.loads((run_dir / "result.json").read_text())
    assert 'id="verdict"' in dom and doc["verdict"]["lines"][1][:40] in dom
    # The page's own check, run by Chromium after load: every image decoded.
    assert re.search(r'data-images="ok (\d+)/\1"', dom), re.search(r'data-images="[^"]*"', dom)


def test_sweep_report_plots_against_block_size_and_shows(tmp_path):
    out = tmp_path / "sweep"
    result = runner.invoke(app, ["simulate", "--workload", "sharegpt", "--requests", "40", "--rate", "4",
                                 "--block-size", "8,32", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    verdict = json.loads(result.stdout)["verdict"]
    assert verdict["swept"] == ["block_size"] and verdict["best_index"] in (0, 1)
    assert (out / "metrics_vs_block_size.png").is_file() and not (out / "metrics_vs_rate.png").exists()
    html = (out / "report.html").read_text()
    _self_contained(html)
    assert 'class="best"' in html and "Block size acts twice" in html
    dom = _render(out / "report.html", tmp_path)
    assert "Best: block" in dom and re.search(r'data-images="ok (\d+)/\1"', dom)


def test_capacity_report_names_the_binding_limit_and_plots(tmp_path):
    result = runner.invoke(app, ["capacity", "--slo", "tpot_p99=0.05", "--slo", "ttft_p99=5", "--workload",
                                 "alpaca", "--requests", "80", "--tolerance", "0.15", "--out", str(tmp_path),
                                 "--policy", "paper", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["capacity_rate"] > 0 and doc["binding_slo"] in ("tpot_p99", "ttft_p99", "num_rejected")
    assert doc["cost_model"] == doc["at_capacity"]["cost_model"] and doc["cost_model"] in " ".join(
        doc["verdict"]["lines"])
    at = doc["at_capacity_summary"]
    assert at["output_token_throughput"] > 0 and at["ttft_p99"] <= 5 and at["tpot_p99"] <= 0.05
    lines = " ".join(doc["verdict"]["lines"])
    assert "Capacity:" in lines and "Binding limit" in lines and "output tok/s" in lines and "Cost model" in lines
    assert (tmp_path / "capacity.png").stat().st_size > 1000
    html = (tmp_path / "report.html").read_text()
    _self_contained(html)
    assert "Binding limit" in html
