"""The sparse mixture-of-experts block shared by Qwen3-MoE, Mixtral and gpt-oss.

A router (one linear layer) scores every expert for each token; each token is
sent to its ``top_k`` experts and gets back the weighted sum of their outputs.
The architectures differ only in

- routing: Qwen3-MoE and Mixtral take the softmax over all experts and keep
  the top k (Mixtral always renormalizes the kept weights to sum to 1, Qwen3
  when ``norm_topk_prob``); gpt-oss keeps the top k logits and takes the
  softmax over those (the same weights as renormalizing, computed differently);
- the expert MLP: SwiGLU, silu(gate) * up, or gpt-oss's clamped variant with
  biases (see ``clamped_swiglu``).

Experts are stored fused, as vLLM's FusedMoE stores them: ``w13`` [E, 2I, H]
(gate rows, then up rows) and ``w2`` [E, H, I], plus optional biases. The
models' loaders turn both checkpoint layouts into these: per-expert matrices
(what ``save_pretrained`` writes for Qwen3-MoE and Mixtral) and transformers
5's fused 3-D tensors (gpt-oss, whose gate/up columns are interleaved and
whose matrices are stored [in, out]).

The forward pass groups the tokens by expert and runs one pair of matmuls per
expert that got any token. The group sizes are read on the host, so this
block cannot be captured in a CUDA graph (``cuda_graphs = False`` on the
models that use it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.weights import WeightLoader


def softmax_top_k(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-MoE / Mixtral routing: softmax over all experts (fp32), keep the top k.

    logits [T, E] -> (weights [T, k] fp32, expert ids [T, k]).
    """
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def top_k_softmax(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """gpt-oss routing: keep the top k logits, softmax over just those (in the logits' dtype, as gpt-oss does)."""
    values, ids = torch.topk(logits, top_k, dim=-1)
    return torch.softmax(values, dim=-1), ids


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU on [.., 2I] = [gate | up]: silu(gate) * up."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def clamped_swiglu(alpha: float, limit: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """gpt-oss's expert activation on [gate | up]: gate clamped from above and up on both
    sides at ``limit`` (keeps activations bounded for its low-precision weights), then
    (up + 1) * gate * sigmoid(alpha * gate)."""
    def activation(gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
        return (up + 1) * (gate * torch.sigmoid(gate * alpha))
    return activation


class SparseMoeBlock(nn.Module):
    """Router + ``num_experts`` gated MLPs; each token runs through its top-k experts."""

    def __init__(self, hidden: int, intermediate: int, num_experts: int, top_k: int,
                 route: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
                 activation: Callable[[torch.Tensor], torch.Tensor] = silu_and_mul, bias: bool = False):
        super().__init__()
        self.num_experts, self.top_k, self.intermediate = num_experts, top_k, intermediate
        self.route, self.activation = route, activation
        self.router = nn.Linear(hidden, num_experts, bias=bias)
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden, intermediate))
        self.b13 = nn.Parameter(torch.empty(num_experts, 2 * intermediate)) if bias else None
        self.b2 = nn.Parameter(torch.empty(num_experts, hidden)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(self.router(x))        # [T, k] each
        # Sort the T*k (token, expert) pairs by expert: each expert's tokens
        # are then one contiguous run. A stable sort keeps tokens in order.
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)
        tokens = order // self.top_k
        pair_weights = weights.flatten()[order].to(x.dtype)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        out = torch.zeros_like(x)
        start = 0
        # Experts in increasing id, each token's contributions added in that
        # order: the same summation order as transformers' expert loop.
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            rows = tokens[start:start + count]
            h = F.linear(x[rows], self.w13[expert], None if self.b13 is None else self.b13[expert])
            h = F.linear(self.activation(h), self.w2[expert], None if self.b2 is None else self.b2[expert])
            # A token meets an expert at most once, so the rows are distinct. index_put_ rather
            # than index_add_: the same sums, and index_add_ costs ~0.3 ms a call on a CPU.
            out.index_put_((rows,), h * pair_weights[start:start + count, None], accumulate=True)
            start += count
        return out

    # -- loading: each form a checkpoint may store the experts in --
    def load_expert(self, loader: WeightLoader, prefix: str, expert: int, part: str, tensor: torch.Tensor) -> None:
        """One expert's ``gate`` [I, H], ``up`` [I, H] or ``down`` [H, I] matrix (nn.Linear layout)."""
        if part == "down":
            loader.load_slice(prefix + "w2", tensor, expert, f"{expert}")
        else:
            rows = slice(0, self.intermediate) if part == "gate" else slice(self.intermediate, 2 * self.intermediate)
            loader.load_slice(prefix + "w13", tensor, (expert, rows), f"{expert}.{part}")

    def load_fused(self, loader: WeightLoader, prefix: str, part: str, tensor: torch.Tensor,
                   interleaved_transposed: bool = False) -> None:
        """All experts at once: ``gate_up`` [E, 2I, H] (gate rows first) / ``down`` [E, H, I],
        or their ``*_bias`` [E, 2I] / [E, H]. ``interleaved_transposed``: gpt-oss's layout,
        matrices stored [E, in, out] and gate/up alternating along the 2I axis."""
        if interleaved_transposed:
            if part in ("gate_up", "down"):
                tensor = tensor.transpose(1, 2)
            if part in ("gate_up", "gate_up_bias"):
                # [.., 2I, ..] with gate at even and up at odd positions -> gate block, then up block.
                tensor = torch.cat([tensor[:, 0::2], tensor[:, 1::2]], dim=1)
        names = {"gate_up": "w13", "down": "w2", "gate_up_bias": "b13", "down_bias": "b2"}
        loader.load(prefix + names[part], tensor.contiguous())
