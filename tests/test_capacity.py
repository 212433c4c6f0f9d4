"""The capacity report's lines (planner/sizing/capacity.py)."""
from __future__ import annotations

from planner.sizing.capacity import _binding_line


def test_the_binding_line_does_not_round_a_miss_onto_its_limit():
    """0.010509 against a 0.0105 limit read "reached 0.0105" at 3 digits: one more says it passed it."""
    line = _binding_line("tpot_p99", {"tpot_p99": 0.0105}, "45.6 req/s", {"tpot_p99": 0.010509})
    assert line == "Binding limit: tpot_p99 <= 0.0105 (at 45.6 req/s it reached 0.01051)."
    assert _binding_line("ttft_p99", {"ttft_p99": 2}, "8 req/s", {"ttft_p99": 2.6789}).endswith("reached 2.68).")
