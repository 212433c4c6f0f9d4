"""NVIDIA's timed vLLM GDN kernels (planner/cost/measured_gdn.py): grid points, monotone, scaled shapes."""

import csv
import gzip
from pathlib import Path

import pytest

from planner.cost.measured_gdn import GdnKernels, timed_shapes
from planner.errors import PlannerError

DATA = Path(__file__).parent.parent / "planner" / "data" / "measured"
QWEN3_NEXT_TP1 = (16, 32, 128, 128)        # 16 key heads, 32 value heads: Qwen3-Next-80B / Qwen3.5-9B on one GPU
# The leave-one-out bound bench/bench_gdn_shapes.py finds on H100, H200 and B200 (worst 1.07), with slack.
LOO_BOUND = 1.10


def csv_seconds(system, shape):
    """{(kernel, phase, batch, seq_len): latency in seconds} read straight from the extracted table."""
    rows = {}
    with gzip.open(DATA / system / "gdn.csv.gz", "rt") as f:
        for row in csv.DictReader(f):
            if tuple(int(row[k]) for k in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim")) == shape:
                key = (row["kernel"], row["phase"], int(row["batch_size"]), int(row["seq_len"]))
                rows[key] = float(row["latency_ms"]) * 1e-3
    return rows


def consistent(line):
    """The points of {x: latency} no monotone fit moves: at least every point before, at most every one after."""
    xs = sorted(line)
    return {x for i, x in enumerate(xs)
            if all(line[a] <= line[x] for a in xs[:i]) and all(line[x] <= line[b] for b in xs[i + 1:])}


def exact_points(rows, phase):
    """(batch, seq_len) where both kernels' rows are consistent along every axis, with their summed seconds."""
    points = None
    for kernel in ("conv", "delta_rule"):
        mine = {(b, s): v for (k, p, b, s), v in rows.items() if (k, p) == (kernel, phase)}
        ok = {(b, s) for b, s in mine
              if b in consistent({bb: v for (bb, ss), v in mine.items() if ss == s})
              and s in consistent({ss: v for (bb, ss), v in mine.items() if bb == b})}
        points = ok if points is None else points & ok
    return {(b, s): sum(rows[k, phase, b, s] for k in ("conv", "delta_rule")) for b, s in points}


@pytest.mark.parametrize("system", ["h200_sxm", "b200_sxm"])
def test_a_timed_shape_is_exact_on_its_decode_grid(system):
    gdn = GdnKernels.load(system, *QWEN3_NEXT_TP1)
    assert gdn.how == "measured"
    points = exact_points(csv_seconds(system, QWEN3_NEXT_TP1), "generation")
    assert len(points) >= 6 and (1024, 1) in points
    for (batch, _), seconds in points.items():
        assert gdn.decode(batch) == (pytest.approx(seconds, rel=1e-9), False)


@pytest.mark.parametrize("system", ["h200_sxm", "b200_sxm"])
def test_a_timed_shape_is_exact_on_its_prefill_grid(system):
    gdn = GdnKernels.load(system, *QWEN3_NEXT_TP1)
    points = exact_points(csv_seconds(system, QWEN3_NEXT_TP1), "context")
    assert len(points) >= 40 and (64, 32768) in points
    for (batch, seq_len), seconds in points.items():
        assert gdn.prefill(batch, batch * seq_len) == (pytest.approx(seconds, rel=1e-9), False)


def test_decode_and_prefill_grow_with_sequences_and_tokens():
    gdn = GdnKernels.load("h200_sxm", *QWEN3_NEXT_TP1)
    decode = [gdn.decode(b)[0] for b in range(1, 1100, 7)]
    assert decode == sorted(decode)
    for seqs in (1, 3, 8, 64):
        prefill = [gdn.prefill(seqs, t)[0] for t in range(seqs * 16, 40000, 997)]
        assert prefill == sorted(prefill)
    for per_seq in (1, 100, 1024, 5000):
        by_seqs = [gdn.prefill(seqs, seqs * per_seq)[0] for seqs in range(1, 70, 3)]
        assert by_seqs == sorted(by_seqs)


def test_outside_the_grid_is_flagged():
    gdn = GdnKernels.load("h200_sxm", *QWEN3_NEXT_TP1)
    assert gdn.decode(2048)[1] and not gdn.decode(1000)[1]
    assert gdn.prefill(128, 128 * 1024)[1] and not gdn.prefill(64, 64 * 1024)[1]
    assert gdn.decode(0) == (0.0, False) and gdn.prefill(0, 0) == (0.0, False)


def test_a_system_nvidia_did_not_time_with_vllm_has_none():
    # a100_sxm's GDN tables are SGLang's only
    assert timed_shapes("a100_sxm") == ()
    assert GdnKernels.load("a100_sxm", *QWEN3_NEXT_TP1) is None


@pytest.mark.parametrize("system", ["h100_sxm", "h200_sxm", "b200_sxm"])
def test_each_timed_shape_priced_from_the_others_is_within_the_leave_one_out_bound(system):
    for shape in timed_shapes(system):
        own, scaled = GdnKernels.load(system, *shape), GdnKernels.without_own(system, *shape)
        assert scaled.how == "scaled" and scaled.timed != shape
        for seqs in (1, 4, 16, 64, 256):
            ratio = scaled.decode(seqs)[0] / own.decode(seqs)[0]
            assert 1 / LOO_BOUND < ratio < LOO_BOUND, (shape, seqs, ratio)
        for seqs, tokens in ((1, 1024), (1, 8192), (8, 4096)):
            ratio = scaled.prefill(seqs, tokens)[0] / own.prefill(seqs, tokens)[0]
            assert 1 / LOO_BOUND < ratio < LOO_BOUND, (shape, seqs, tokens, ratio)


def test_an_untimed_shape_is_scaled_from_the_nearest_one_with_its_head_ratio():
    gdn = GdnKernels.load("h200_sxm", 3, 6, 128, 128)       # ratio 2: (2, 4) and (4, 8) timed; 8/6 < 6/4
    assert (gdn.how, gdn.timed) == ("scaled", (4, 8, 128, 128))
    small, large = GdnKernels.load("h200_sxm", 2, 4, 128, 128), GdnKernels.load("h200_sxm", 4, 8, 128, 128)
    for seqs in (1, 32, 512):
        assert small.decode(seqs)[0] <= gdn.decode(seqs)[0] <= large.decode(seqs)[0]
    assert GdnKernels.load("h200_sxm", 5, 5, 128, 128).timed == (4, 4, 128, 128)   # ratio 1
    assert GdnKernels.load("h200_sxm", 3, 15, 128, 128).timed[:2] == (4, 16)       # ratio 5 untimed: nearest heads


def test_wider_heads_cost_their_state_size():
    base = GdnKernels.load("h200_sxm", *QWEN3_NEXT_TP1)
    wide = GdnKernels.load("h200_sxm", 16, 32, 256, 128)
    assert wide.how == "scaled"
    assert wide.decode(256)[0] == pytest.approx(2 * base.decode(256)[0])


def test_decode_of_a_large_batch_moves_the_fp32_state_at_h200_bandwidth():
    seconds, extrapolated = GdnKernels.load("h200_sxm", *QWEN3_NEXT_TP1).decode(1024)
    state_bytes = 2 * 1024 * 32 * 128 * 128 * 4        # read and written once a step
    assert not extrapolated
    assert 1 / 1.5 < seconds / (state_bytes / 4.8e12) < 1.5


def test_bad_shapes_and_counts_are_one_line_errors():
    with pytest.raises(PlannerError):
        GdnKernels.load("h200_sxm", 0, 32, 128, 128)
    gdn = GdnKernels.load("h200_sxm", *QWEN3_NEXT_TP1)
    for call in (lambda: gdn.decode(-1), lambda: gdn.prefill(4, 3), lambda: gdn.prefill(0, 5)):
        with pytest.raises(PlannerError):
            call()
