"""A run too large for the machine's memory stops with a one-line error, never the kernel's OOM killer."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from engine.deployment import Deployment
from planner.api import run_spec
from planner.cli.app import app
from planner.runs.pipeline import Simulation
from planner.runs.spec import Load
from planner.sim import memory_guard
from planner.sim.memory_guard import CHECK_EVERY, MemoryGuard, OutOfMemory

GIB = 1 << 30
runner = CliRunner()


@pytest.fixture
def one_gib(monkeypatch):
    """A machine with 1 GiB available, whatever this one has."""
    monkeypatch.setattr(memory_guard, "available_bytes", lambda: GIB)


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("load, source", [
    (Load(rate=2, duration=1e9), "--duration 1e+09 s at 2 req/s is about 2,000,000,000 requests"),
    (Load(rate=2, requests=10**9), "1,000,000,000 requests are"),
    (Load(rate=2, requests=10**9, duration=3e8), "--duration 3e+08 s at 2 req/s is about 600,000,000 requests"),
    (Load(concurrency=8, requests=10**9), "1,000,000,000 requests are"),
])
def test_a_trace_that_cannot_fit_is_refused_before_it_is_made(one_gib, load, source):
    with pytest.raises(OutOfMemory, match="more than this machine's memory can simulate") as refused:
        load.trace()                     # at once: making 10**9 requests would take hours first
    assert str(refused.value).startswith(source) and "\n" not in str(refused.value)


def test_a_trace_that_fits_is_made(one_gib):
    assert len(Load(rate=2, requests=1000, duration=1e9).trace()) == 1000     # the count bounds it
    assert len(Load(rate=4, duration=60).trace()) > 0


def test_a_fleet_whose_block_tables_cannot_fit_is_refused(one_gib, tmp_path):
    result = invoke("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--requests", 5, "--rate", 2,
                    "--replicas", 1000, "--out", tmp_path)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: 1,000 replicas of ") and result.stderr.count("\n") == 1
    assert "give fewer --replicas" in result.stderr


def test_one_deployments_block_tables_that_cannot_fit_are_refused(one_gib, tmp_path):
    """A mistyped cache size (1e6 GiB of swap, 1e10 GPU blocks, 1e6 GiB of CPU offloading) is refused before a
    block table is built."""
    for flags, blocks in ((["--policy", "paper", "--swap-space", "1e6"], "81,920,914"),
                          (["--num-gpu-blocks", "10000000000"], "10,000,000,000"),
                          (["--kv-offloading-size", "1e6"], "81,921,241")):       # 81,920,000 offloading
        result = invoke("simulate", "--requests", 5, "--out", tmp_path, *flags)
        assert result.exit_code == 2 and result.stderr.count("\n") == 1
        assert result.stderr.startswith(f"error: a KV cache of {blocks} blocks (GPU, CPU swap and offloading) is "
                                        f"more than")
        assert ("give a smaller --num-gpu-blocks, --num-cpu-blocks, --swap-space or --kv-offloading-size"
                in result.stderr)


def _shrinking_memory(monkeypatch, after: int):
    """Plenty of memory for the first `after` readings, then less than the minimum the guard keeps free."""
    readings = iter(range(10**9))
    monkeypatch.setattr(memory_guard, "available_bytes",
                        lambda: 64 * GIB if next(readings) < after else memory_guard.MIN_FREE_BYTES - 1)
    monkeypatch.setattr(memory_guard, "GUARD", MemoryGuard())


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_run_that_outgrows_memory_stops_at_a_request(monkeypatch, replicas):
    # the trace's size, the block tables (a fleet's or one deployment's) and each engine pass; then memory
    # runs short
    _shrinking_memory(monkeypatch, after=2 + replicas)
    spec = run_spec(Deployment(model="llama-3.1-8b", gpu="h100-sxm"), workload="sharegpt", rate=50,
                    requests=CHECK_EVERY + 10).with_fleet(replicas=replicas)
    with pytest.raises(OutOfMemory, match=rf"the simulation stopped at request sharegpt-{CHECK_EVERY - 1}, "
                                          r"[\d,]+ s into the run: it holds"):
        Simulation.prepare(spec).simulate()


def test_building_engines_past_the_memory_stops_with_one_line(monkeypatch, tmp_path):
    _shrinking_memory(monkeypatch, after=4)     # the trace's size, the block tables and two engines pass
    result = invoke("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--requests", 5, "--rate", 2,
                    "--replicas", 8, "--out", tmp_path)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: the simulation stopped while building its engines")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output


def test_the_guard_lets_a_run_grow_while_the_machine_keeps_as_much_free(monkeypatch):
    guard = MemoryGuard()
    resident = iter([100, 100 + 300 * (1 << 20), 100 + 900 * (1 << 20)])
    monkeypatch.setattr(memory_guard, "resident_bytes", lambda: next(resident))
    monkeypatch.setattr(memory_guard, "available_bytes", lambda: 500 * (1 << 20))
    guard.check(lambda: "first")              # the baseline
    guard.check(lambda: "second")             # grew 300 MiB, 500 MiB left: enough to build its results
    with pytest.raises(OutOfMemory, match="stopped third: it holds 900 MiB and this machine has 500 MiB left"):
        guard.check(lambda: "third")


def test_workload_show_refuses_a_trace_that_cannot_fit(one_gib):
    result = invoke("workload", "show", "sharegpt", "--rate", 2, "--requests", 10**9)
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "1,000,000,000 requests are more than this machine's memory" in result.output


def test_sizes_past_any_arithmetic_are_one_line_errors(tmp_path):
    """Values that overflowed a float or a C long in the middle of a run (tracebacks before stop 68)."""
    cases = ((["--requests", "4", "--swap-space", "1e308"], "swap_space must be a number of GiB from 0 to 1,048,576"),
             (["--rate", "10", "--duration", "1e308"], "more requests than any machine can simulate"),
             (["--requests", "4", "--workload", "prefix", "-p", f"prefix_len={10**20}"], "--param prefix_len"),
             (["--requests", "4", "--workload", "chatbot", "-p", f"max_turns={10**20}"], "--param max_turns"))
    for flags, message in cases:
        result = invoke("simulate", "--out", tmp_path, *flags)
        assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.stderr
        assert message in result.stderr
