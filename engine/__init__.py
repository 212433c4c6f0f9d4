"""A paged LLM inference engine in the style of vLLM (PagedAttention, SOSP 2023).

The core (sequences, block manager, scheduler, metrics) is pure Python and is
imported unchanged by the planner's simulator; ``LLM`` and ``LLMEngine`` load
torch only when first used.
"""
from engine.core.sampling_params import SamplingParams

__all__ = ["LLM", "LLMEngine", "SamplingParams"]


def __getattr__(name: str):
    if name == "LLM":
        from engine.llm import LLM              # torch: loaded when first used
        return LLM
    if name == "LLMEngine":
        from engine.llm_engine import LLMEngine  # torch
        return LLMEngine
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
