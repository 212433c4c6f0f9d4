"""Mamba-2 mixers (Nemotron-H's "M" blocks): a selective state-space layer that keeps a fixed state per
sequence instead of a KV cache.

A Mamba-2 mixer (Dao and Gu, "Transformers are SSMs", 2024) projects each token once (in_proj) to z (the
output gate), x (heads x head_dim), B and C (n_groups x state_size each) and dt (one step size per head);
runs x, B and C through a causal depthwise convolution of conv_kernel taps (biased); updates each head's
head_dim x state_size state with the step's decay exp(dt A) and input dt B x; reads it out with C, adds
D x, normalizes the result with a z-gated RMSNorm over n_groups groups, and projects it back (out_proj).
A sequence holds the convolution's last conv_kernel - 1 inputs (model dtype) and the recurrent states
(mamba_ssm_cache_dtype, float32 in NVIDIA's configs), whatever its length (vLLM's MambaSpec).

Under tensor parallelism vLLM's MambaMixer2 splits the heads, and the groups with them; a model with one
group gives every rank its own copy of it (vllm/model_executor/layers/mamba/mamba_mixer2.py,
extra_groups_for_head_shards).
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.catalog.linear_attention import check_mixer
from planner.errors import PlannerError


@dataclass(frozen=True, slots=True)
class Mamba2:
    """The Mamba-2 mixers of a hybrid model: how many, and their shapes."""

    layers: int
    heads: int
    head_dim: int
    groups: int
    state_size: int
    conv_kernel: int
    state_dtype_bytes: int = 0      # the recurrent state's element size; 0: the model's dtype
    conv_bias: bool = True

    kind = "Mamba-2"

    def __post_init__(self) -> None:
        check_mixer(self, ("layers", "heads", "head_dim", "groups", "state_size", "conv_kernel"), "Mamba-2 mixer")
        if self.heads % self.groups:
            raise PlannerError(f"Mamba-2 mixer: {self.heads} heads are not a multiple of {self.groups} groups")

    @property
    def inner(self) -> int:
        """Width of x (and of z): heads x head_dim."""
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal convolution: x, B and C."""
        return self.inner + 2 * self.groups * self.state_size

    def shapes(self, hidden: int) -> tuple[tuple[int, int], ...]:
        """(outputs, inputs) of one mixer's linear weights: in_proj (z, x, B, C, dt), out_proj."""
        return ((self.inner + self.conv_dim + self.heads, hidden), (hidden, self.inner))

    @property
    def in_weights(self) -> tuple[int, ...]:
        """Which of `shapes` project the input (one GEMM in vLLM), the rest projecting back."""
        return (0,)

    @property
    def other_params(self) -> int:
        """One mixer's convolution taps (and biases), per-head A_log, D and dt_bias, and its gated RMSNorm."""
        return self.conv_dim * (self.conv_kernel + int(self.conv_bias)) + 3 * self.heads + self.inner

    @property
    def recurrent_flops(self) -> int:
        """FLOPs of one token's recurrent step, all heads: per head the state's decay, the rank-one write of
        dt B x and the read by C, each head_dim x state_size multiply-adds."""
        return 3 * 2 * self.inner * self.state_size

    def groups_per_gpu(self, tp: int) -> int:
        if self.groups % tp == 0:
            return self.groups // tp
        if self.groups == 1:
            return 1                     # vLLM copies a lone group to every rank
        raise PlannerError(f"tensor parallel size {tp} does not divide the Mamba-2 mixer's {self.groups} groups")

    def heads_per_gpu(self, tp: int) -> int:
        if self.heads % tp:
            raise PlannerError(f"tensor parallel size {tp} does not divide the Mamba-2 mixer's {self.heads} heads")
        self.groups_per_gpu(tp)
        return self.heads // tp

    def in_proj_per_gpu(self, tp: int) -> int:
        """Outputs of in_proj on one of `tp` GPUs: its heads' z, x and dt, and its groups' B and C."""
        heads = self.heads_per_gpu(tp)
        return heads * (2 * self.head_dim + 1) + 2 * self.groups_per_gpu(tp) * self.state_size

    def out_proj_inputs_per_gpu(self, tp: int) -> int:
        return self.heads_per_gpu(tp) * self.head_dim

    def gated_norm_width_per_gpu(self, tp: int) -> int:
        """Width of the z-gated RMSNorm's input on one of `tp` GPUs."""
        return self.out_proj_inputs_per_gpu(tp)

    def conv_state_per_gpu(self, tp: int) -> int:
        """Values of one sequence's convolution window in one layer on one of `tp` GPUs."""
        channels = self.heads_per_gpu(tp) * self.head_dim + 2 * self.groups_per_gpu(tp) * self.state_size
        return (self.conv_kernel - 1) * channels

    def recurrent_state_per_gpu(self, tp: int) -> int:
        """Values of one sequence's recurrent states in one layer on one of `tp` GPUs."""
        return self.heads_per_gpu(tp) * self.head_dim * self.state_size

    def state_bytes_per_gpu(self, tp: int, dtype_bytes: int) -> int:
        """One sequence's state in one layer on one of `tp` GPUs."""
        return (self.conv_state_per_gpu(tp) * dtype_bytes
                + self.recurrent_state_per_gpu(tp) * (self.state_dtype_bytes or dtype_bytes))
