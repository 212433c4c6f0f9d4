"""`planner search`: the cheapest GPU, TP, block size and batch limit that serve a traffic within SLOs.

    from planner.search import SearchGrid, run_search
"""
from planner.search.executors import EXECUTORS, make_executor
from planner.search.prices import load_prices, parse_price_overrides
from planner.search.search import SearchGrid, SearchResult, run_search

__all__ = ["EXECUTORS", "SearchGrid", "SearchResult", "load_prices", "make_executor", "parse_price_overrides",
           "run_search"]
