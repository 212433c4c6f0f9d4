"""Token sampling math: pure functions of a logits tensor [num_seqs, vocab].

Semantics follow transformers' generate(): temperature first, then top-k,
then top-p on the distribution that remains; top-p keeps the smallest set of
most likely tokens whose cumulative probability reaches p, never fewer than
one token. Randomness comes only from the per-request generators passed in,
so a request with a seed samples the same tokens whatever else is batched
with it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator for one request; it must live on the device the logits are on."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The most likely token per row (ties: lowest id, like argmax)."""
    return logits.argmax(dim=-1)


def logprobs(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1)


def top_k_logprobs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs, token ids), each [num_seqs, k], best first: the candidates beam search extends."""
    return logprobs(logits).topk(k, dim=-1)


def _per_row(value, n: int, dtype: torch.dtype, device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.to(device=device, dtype=dtype).expand(n)
    if isinstance(value, Sequence):
        return torch.tensor(list(value), dtype=dtype, device=device)
    return torch.full((n,), value, dtype=dtype, device=device)


def mask_top_k_top_p(logits: torch.Tensor, top_k, top_p) -> torch.Tensor:
    """Logits with every token outside each row's top-k / top-p set at -inf.

    ``top_k`` <= 0 or >= vocab and ``top_p`` >= 1 disable the filter for that
    row. Accepts a scalar or one value per row for each.
    """
    num_rows, vocab = logits.shape
    k = _per_row(top_k, num_rows, torch.int64, logits.device)
    k = torch.where((k <= 0) | (k > vocab), vocab, k)
    p = _per_row(top_p, num_rows, torch.float32, logits.device)
    sorted_logits, sorted_ids = logits.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=logits.device)
    drop = rank >= k[:, None]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    probs = sorted_logits.float().softmax(dim=-1)
    # Probability mass strictly before each token: a token is kept while the
    # mass before it is still short of p, so the kept set is the smallest one
    # reaching p; the best token (mass before it is 0) is always kept.
    mass_before = probs.cumsum(dim=-1) - probs
    drop |= (mass_before >= p[:, None]) & (rank > 0)
    # Back from sorted order to vocabulary order.
    return logits.masked_fill(torch.empty_like(drop).scatter_(-1, sorted_ids, drop), float("-inf"))


def sample(
    logits: torch.Tensor,
    temperature: float | Sequence[float],
    top_k: int | Sequence[int] = 0,
    top_p: float | Sequence[float] = 1.0,
    generator: torch.Generator | None | Sequence[torch.Generator | None] = None,
) -> torch.Tensor:
    """One token id per row. A row with temperature 0 is greedy.

    ``generator`` is one per row (or one for all); a None generator uses
    torch's global RNG. Each row draws from its own generator only.
    """
    num_rows = logits.shape[0]
    logits = logits.float()
    temps = _per_row(temperature, num_rows, torch.float32, logits.device)
    is_greedy = temps <= 0
    scaled = logits / torch.where(is_greedy, 1.0, temps)[:, None]
    probs = mask_top_k_top_p(scaled, top_k, top_p).softmax(dim=-1)
    generators = list(generator) if isinstance(generator, Sequence) else [generator] * num_rows
    tokens = greedy(logits)
    for row, row_is_greedy in enumerate(is_greedy.tolist()):
        if not row_is_greedy:
            tokens[row] = torch.multinomial(probs[row], 1, generator=generators[row])[0]
    return tokens
