"""`planner search`: the cheapest GPU, TP, block size and batch limit that serve a traffic within SLOs.

    from planner.sizing import SearchGrid, run_search
"""
from planner.runs.pools import EXECUTORS, make_executor
from planner.sizing.prices import load_prices, parse_price_overrides
from planner.sizing.search import SearchGrid, SearchResult, run_search

__all__ = ["EXECUTORS", "SearchGrid", "SearchResult", "load_prices", "make_executor", "parse_price_overrides",
           "run_search"]
