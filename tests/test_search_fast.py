"""The fast configuration search gives the answers of the plain one: early stops, hints and shared runs."""
from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.block_manager import BlockManager
from engine.core.metrics import percentile, slo_attainment
from planner.sizing import SearchGrid, run_search
from planner.sizing.capacity import Hint, full_probe, judged, search_capacity
from planner.runs.pools import LocalExecutor
from planner.sizing.probe import WATERMARK, Probe, Prober, SharedRuns, Trajectory, violations_to_fail
from planner.sizing.search import ConfigTask
from planner.runs.pipeline import Simulation
from sim_helpers import search_grid

SLOS = {"ttft_p99": 2.0, "tpot_p99": 0.1}


def grid(**changes) -> SearchGrid:
    # opt-13b's measured cost model prices a step the same at every block size, so block
    # sizes can share runs; a100-80g x1 at m=128 fills its KV cache, so some cannot.
    base = dict(model="opt-13b", workload="sharegpt", slos=SLOS, gpus=("a100-80g",), tps=(1,),
                block_sizes=(16, 64), max_num_seqs=(8, 32, 128), target_rate=1.0, duration=None, requests=80,
                tolerance=0.1, max_rate=64.0)
    return search_grid(**{**base, **changes})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=300), st.sampled_from([50, 90, 99]),
       st.floats(0.1, 9))
def test_enough_values_above_a_limit_put_the_percentile_above_it(values, q, limit):
    above = sum(v > limit for v in values)
    needed = violations_to_fail(len(values), q)
    if above >= needed:
        assert percentile(values, q) > limit
    # Non-decreasing in n: counting against the whole trace is safe for a subset.
    assert violations_to_fail(len(values) + 1, q) >= needed


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 5000), max_size=60), st.sampled_from([8, 16, 32, 64, 128]))
def test_the_block_bound_covers_every_sequence(tokens, block_size):
    used = sum(-(-t // block_size) for t in tokens)
    assert used <= (sum(tokens) + len(tokens) * (block_size - 1)) // block_size


def test_the_watermark_is_the_block_managers():
    assert BlockManager(16, 1000).watermark_blocks == int(WATERMARK * 1000)


def test_trajectory_fits_only_a_cache_with_room_for_every_step():
    trajectory = Trajectory(token_slots=[100, 900, 400], num_seqs=[1, 9, 4], shapes=[], max_prompt=100)
    # Peak: 900 tokens in 9 sequences -> at most (900 + 9*15) // 16 = 64 blocks of 16, plus 7 for a prompt.
    assert trajectory.fits(16, 72)             # 72 - watermark 0 - 7 = 65 >= 64
    assert not trajectory.fits(16, 70)
    assert not trajectory.fits(16, 5)


def test_an_early_stop_gives_the_full_runs_verdict():
    spec = ConfigTask(grid(), "a100-80g", 1, 16, 32).spec()
    simulation = Simulation.prepare(spec)
    early, full = Prober(simulation, SLOS), Prober(simulation, SLOS, early_stop=False)
    stopped = 0
    for rate in (0.5, 2.0, 3.0, 8.0, 30.0):
        fast = early(rate)
        stopped += fast.stopped_early
        reference = full_probe(simulation, rate, SLOS)         # planner capacity's own probe
        assert fast.ok == full(rate).ok == reference.ok, rate
        assert fast.lengthened_to == reference.lengthened_to, rate
        if fast.ok:
            assert fast.doc["ttft_p99"] == full(rate).doc["ttft_p99"]
    assert stopped >= 2


def test_an_early_stop_by_slo_attainment_gives_the_full_runs_verdict():
    """Judged by SLO attainment, a probe stops once too many requests have missed a limit: the same verdict as
    the full run and as `planner capacity`'s probe, at rates where some requests miss and the share still holds,
    where it does not hold without requests piling up, and where they pile up."""
    slos = {"ttft_p99": 0.5, "tpot_p99": 0.035}
    spec = replace(ConfigTask(grid(), "a100-80g", 1, 16, 32).spec(), slo_attainment=0.95)
    simulation = Simulation.prepare(spec)
    early, full = Prober(simulation, slos), Prober(simulation, slos, early_stop=False)
    counted = Simulation.prepare(judged(spec, slos))       # its runs count the requests within the SLOs
    shares, stopped = [], 0
    for rate in (1.0, 2.0, 2.3, 2.6, 8.0):
        fast, whole = early(rate), full(rate)
        stopped += fast.stopped_early
        reference = full_probe(counted, rate, slos)
        assert fast.ok == whole.ok == reference.ok == (slo_attainment(whole.doc) >= 0.95
                                                       and not whole.doc["verdict"]["overloaded"]), rate
        assert slo_attainment(whole.doc) == slo_attainment(reference.doc), rate
        shares.append((slo_attainment(whole.doc), whole.ok, whole.doc["verdict"]["overloaded"]))
    assert any(ok and share < 1 for share, ok, _ in shares)             # misses within the share
    assert any(not ok and not piling for _, ok, piling in shares)       # too many misses, the engine keeping up
    assert stopped >= 1


def test_a_block_size_replays_a_run_only_when_the_cache_never_constrained_it():
    g = grid(requests=300)
    probers = {}
    for block in (16, 64, 128):
        probers[block] = Prober(Simulation.prepare(ConfigTask(g, "a100-80g", 1, block, 128).spec()), SLOS,
                                early_stop=False)
    shared = SharedRuns(probers)
    replayed = refused = 0
    for rate in (1.0, 4.0, 60.0):
        shared.probe(16, rate)
        for block in (64, 128):
            probe = shared.probe(block, rate)
            own = probers[block](rate)
            assert probe.ok == own.ok
            if probe.shared_from is not None:
                replayed += 1
                # The same run, step for step: the same latencies to the last bit.
                assert {k: probe.doc[k] for k in SLOS} == {k: own.doc[k] for k in SLOS}
            else:
                refused += 1
    assert replayed and refused      # both happen on this grid (the cache fills at the higher rates)


def test_a_hint_only_moves_where_the_search_starts():
    capacity = 7.3

    def probe(rate: float) -> Probe:
        return Probe(rate, rate <= capacity, {})

    limits = dict(start=1.0, min_rate=0.01, max_rate=64.0, rel_tol=0.05)
    scratch = search_capacity(probe, **limits)
    for hint in (Hint(7.0, 7.5), Hint(2.0, 2.2), Hint(30.0, None), Hint(None, 0.02), Hint(64.0, None)):
        hinted = search_capacity(probe, hint=hint, **limits)
        assert hinted.rate <= capacity < hinted.bad and (hinted.bad - hinted.rate) / hinted.bad <= 0.05
        assert abs(hinted.rate - scratch.rate) <= 0.05 * scratch.rate
    assert len(search_capacity(probe, hint=Hint(7.2, 7.5), **limits).probes) == 2   # within 5%: done


def test_the_fast_search_agrees_with_the_plain_search():
    g = grid()
    fast = run_search(g, LocalExecutor(1))
    plain = run_search(replace(g, plain=True), LocalExecutor(1))
    for a, b in zip(fast.configs, plain.configs):
        assert (a["gpu"], a["block_size"], a["max_num_seqs"]) == (b["gpu"], b["block_size"], b["max_num_seqs"])
        assert abs(a["capacity"] - b["capacity"]) <= g.tolerance * max(a["capacity"], b["capacity"]), (a, b)
    # ... with fewer simulations: hints, early stops and shared runs all did their part.
    assert sum(r["simulations"] for r in fast.configs) < sum(r["simulations"] for r in plain.configs)
    assert any(r["early_stops"] for r in fast.configs)
    assert any(r["simulations"] < r["probes"] for r in fast.configs)
    # The executor does not change the answer (hints come from earlier waves only).
    assert run_search(g, LocalExecutor(2)).configs == fast.configs


def test_the_fast_search_by_slo_attainment_agrees_with_the_plain_search():
    g = grid(slos={"ttft_p99": 0.5, "tpot_p99": 0.035}, block_sizes=(16,), max_num_seqs=(8, 32))
    g = replace(g, base=replace(g.base, slo_attainment=0.95))
    fast, plain = run_search(g, LocalExecutor(1)), run_search(replace(g, plain=True), LocalExecutor(1))
    assert fast.document()["slo_attainment"] == 0.95
    for a, b in zip(fast.configs, plain.configs):
        assert abs(a["capacity"] - b["capacity"]) <= g.tolerance * max(a["capacity"], b["capacity"]), (a, b)
    # p99s within two limits leave at most about 2% of the requests outside one: 95% within both is looser
    by_p99 = run_search(replace(g, base=replace(g.base, slo_attainment=None)), LocalExecutor(1))
    assert all(a["capacity"] >= (1 - g.tolerance) * b["capacity"] for a, b in zip(fast.configs, by_p99.configs))
    assert any(a["capacity"] > b["capacity"] for a, b in zip(fast.configs, by_p99.configs))
