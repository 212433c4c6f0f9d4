"""The scheduling knobs, their defaults and their validation, in one place.

Every front end (``LLM``/``LLMEngine`` kwargs, ``SimConfig``, the CLI) uses
these names and lets ``SchedulerConfig`` check them, so a bad value gets the
same one-line error everywhere.
"""
from __future__ import annotations

from dataclasses import dataclass

# What the CUDA and CPU attention kernels are instantiated for: the live
# engine, the profiler and the kernel checks accept these block sizes only.
SUPPORTED_BLOCK_SIZES = (8, 16, 32)
# The simulator also takes the other powers of two the paper's block-size
# ablation sweeps (Fig. 18: 1..256); no kernel runs them.
SIM_BLOCK_SIZES = (1, 2, 4, *SUPPORTED_BLOCK_SIZES, 64, 128, 256)

PREEMPTION_MODES = ("recompute", "swap")
SCHEDULING_POLICIES = ("fcfs", "priority")   # vLLM v1's --scheduling-policy; the first is its default
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048   # vLLM v0's default floor for the token budget


@dataclass
class SchedulerConfig:
    """Engine limits the scheduler enforces (vLLM's names and defaults).

    max_model_len: longest sequence (prompt + output) the model may hold.
    max_num_seqs: most sequences in one step.
    max_num_batched_tokens: most tokens in one prefill step; default
        ``max(max_model_len, 2048)``, as vLLM v0.
    preemption_mode: how a single-sequence request is preempted when memory
        runs out; requests with several sequences (parallel sampling, beam
        search) are always swapped where the allocator can, as vLLM v0 does.
    block_size: KV block size in tokens (validated against ``SIM_BLOCK_SIZES``;
        the live engine further requires ``SUPPORTED_BLOCK_SIZES``).
    enable_prefix_caching: reuse the KV blocks of equal prompt prefixes.
    vllm_v1: the policy. False is the paper's (``engine/core/scheduler.py``);
        True is vLLM v1's (``engine/core/chunked_scheduler.py``, built by its
        ``make_scheduler``).
    enable_chunked_prefill: vLLM's knob, a setting of v1's scheduler only
        (True asks for that scheduler; None: on exactly under it). On, the
        token budget defaults to 2048 and may be below ``max_model_len``; off,
        a waiting prompt larger than the budget left ends admission, as vLLM
        0.19 without chunked prefill does, and the budget must hold
        ``max_model_len`` (default ``max(max_model_len, 2048)``).
    long_prefill_token_threshold: vLLM v1's cap on the tokens one request
        takes in a step (a long prompt's chunk, drafts included), so a long
        prompt leaves budget to others; 0: no cap but the budget (vLLM's
        default). vLLM v1 only.
    scheduling_policy: vLLM v1's ``--scheduling-policy``: ``fcfs`` (its
        default) or ``priority`` (waiting requests by priority, then arrival;
        the running request of the lowest priority, latest arrival, is
        preempted first). vLLM v1 only.
    max_loras: vLLM's ``--max-loras`` with ``--enable-lora``: the most
        distinct LoRA adapters in one step; a waiting request of another
        adapter is passed over while that many run, and those behind it may
        go first (vllm/v1/core/sched/scheduler.py). None: no LoRA. vLLM v1 only.
    """

    max_model_len: int
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    preemption_mode: str = "recompute"
    block_size: int = 16
    enable_prefix_caching: bool = False
    vllm_v1: bool = False
    enable_chunked_prefill: bool | None = None
    long_prefill_token_threshold: int = 0
    scheduling_policy: str = "fcfs"
    max_loras: int | None = None

    def __post_init__(self) -> None:
        if self.enable_chunked_prefill:     # chunked prefill is vLLM v1's scheduler
            self.vllm_v1 = True
        elif self.enable_chunked_prefill is None:
            self.enable_chunked_prefill = self.vllm_v1
        if self.max_loras is not None and (self.max_loras < 1 or not self.vllm_v1):
            raise ValueError(f"max_loras must be >= 1 and needs vLLM v1's scheduler, got {self.max_loras}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError(f"long_prefill_token_threshold must be 0 (off) or more tokens, "
                             f"got {self.long_prefill_token_threshold}")
        if self.long_prefill_token_threshold and not self.vllm_v1:
            raise ValueError("long_prefill_token_threshold caps the chunks of vLLM v1's chunked prefill: "
                             "the paper's policy prefills each prompt whole")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, "
                             f"got {self.scheduling_policy!r}")
        if self.scheduling_policy != "fcfs" and not self.vllm_v1:
            raise ValueError("priority scheduling is vLLM v1's (--policy vllm-v1): the paper's policy is FCFS")
        if self.vllm_v1:
            self._check_v1()
            return
        if self.max_model_len < 1:
            raise ValueError(f"max_model_len must be positive, got {self.max_model_len}")
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = max(self.max_model_len, DEFAULT_MAX_NUM_BATCHED_TOKENS)
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be positive, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                             f"max_model_len ({self.max_model_len}), or long prompts could never run")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption mode must be one of {', '.join(PREEMPTION_MODES)}, "
                             f"got {self.preemption_mode!r}")
        check_block_size(self.block_size, SIM_BLOCK_SIZES)

    def _check_v1(self) -> None:
        """vLLM v1's checks: with chunked prefill the budget only has to let every running request
        decode; without, it must hold a whole prompt (vllm/config/scheduler.py verify_max_model_len)."""
        if self.max_model_len < 1:
            raise ValueError(f"max_model_len must be positive, got {self.max_model_len}")
        if self.max_num_batched_tokens is None:       # vLLM v1's default too
            self.max_num_batched_tokens = (DEFAULT_MAX_NUM_BATCHED_TOKENS if self.enable_chunked_prefill
                                           else max(self.max_model_len, DEFAULT_MAX_NUM_BATCHED_TOKENS))
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) is below max_model_len "
                             f"({self.max_model_len}): without chunked prefill a prompt that long could never "
                             f"run (vLLM refuses it too); raise the budget or lower max_model_len")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be positive, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                             f"max_num_seqs ({self.max_num_seqs}), so every running request can decode")
        if self.preemption_mode != "recompute":
            raise ValueError("chunked prefill preempts by recompute only (as vLLM v1 does), "
                             f"not {self.preemption_mode!r}")
        check_block_size(self.block_size, SIM_BLOCK_SIZES)


def check_block_size(block_size: int, supported: tuple[int, ...] = SUPPORTED_BLOCK_SIZES) -> None:
    """Raise a one-line ValueError unless ``block_size`` is one of ``supported``."""
    if block_size not in supported:
        raise ValueError(f"block_size {block_size} is not supported; choose one of "
                         f"{', '.join(map(str, supported))}")
