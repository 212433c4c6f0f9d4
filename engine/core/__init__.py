"""The engine's pure core, shared unchanged by the live engine and the simulator.

- ``config``: ``SchedulerConfig`` (the canonical knobs, their defaults and
  validation) and ``SUPPORTED_BLOCK_SIZES``;
- ``sequence``, ``sampling_params``: requests and how to decode them;
- ``kv_allocator`` (the interface), ``block_pool``, ``block_manager`` (paged),
  ``contiguous_allocator`` (the paper's Orca baselines), ``allocators``
  (``make_allocator`` by name);
- ``scheduler`` (FCFS, vLLM v0.2.0's rules), ``beam_search``, ``stopping``;
- ``chunked_scheduler``: vLLM v1's chunked-prefill policy (``ChunkedScheduler``,
  ``VllmBlockManager`` over the FIFO ``VllmBlockPool``, ``make_scheduler``);
- ``step``: the one step helper the engine, simulator and profiler run;
- ``metrics``: per-request and per-step records and the metric set.

Nothing under ``engine/core`` imports torch (``tests/test_core_is_pure.py``
guards it): the planner's simulator imports this package unchanged and runs
millions of steps with it.
"""
