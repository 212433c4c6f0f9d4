"""The engine's pure core: sequences, sampling parameters, the block manager
and contiguous allocators, the scheduler and metrics.

Nothing under ``engine/core`` imports torch (``tests/test_core_is_pure.py``
guards it): the planner's simulator imports this package unchanged and runs
millions of steps with it.
"""
