"""Decode steps replayed from CUDA graphs, one graph per batch-size bucket, as vLLM does.

A decode step of a small model is mostly kernel launches: tens of µs of
host work per layer. Capturing the model's forward once per bucket and
replaying it costs one launch. A batch of n sequences runs in the graph of
the smallest bucket >= n (1, 2, 4, then multiples of 8 up to 256); the
padding rows compute a throw-away token: their slot is -1 (nothing stored)
and their context is one token of block 0.

Graphs read their inputs from static buffers, so a step copies its tensors
into them and replays. The attention kernels' ``max_seq_len`` is fixed at
capture (``MAX_SEQ_LEN_TO_CAPTURE`` or the model's limit, if smaller); the
kernels loop over each row's own ``seq_lens``, so it only sizes shared
memory and v2's partitions. Longer contexts, larger batches, prefills and
sliding-window models run eagerly.

``DecodeGraphs(..., capture=False)`` runs the same static-buffer path
without graphs; the CPU tests use it to check the bucketing and padding.
"""
from __future__ import annotations

import torch

from engine.attention import AttentionMetadata

# vLLM's capture sizes: 1, 2, 4, then every multiple of 8 up to 256.
BATCH_SIZE_ALIGNMENT = 8
CAPTURE_SIZES = (1, 2, 4) + tuple(BATCH_SIZE_ALIGNMENT * i for i in range(1, 33))
MAX_SEQ_LEN_TO_CAPTURE = 8192


def graph_batch_size(num_seqs: int) -> int | None:
    """The bucket a decode batch of ``num_seqs`` is padded to, or None if it is larger than every bucket."""
    if num_seqs <= 2:
        return num_seqs if num_seqs >= 1 else None
    if num_seqs <= 4:
        return 4
    padded = -(-num_seqs // BATCH_SIZE_ALIGNMENT) * BATCH_SIZE_ALIGNMENT
    return padded if padded <= CAPTURE_SIZES[-1] else None


def capture_sizes(max_num_seqs: int) -> list[int]:
    """The buckets a runner serving at most ``max_num_seqs`` sequences needs."""
    largest = graph_batch_size(min(max_num_seqs, CAPTURE_SIZES[-1]))
    return [size for size in CAPTURE_SIZES if size <= largest]


class DecodeGraphs:
    """Static input buffers and one captured forward per bucket."""

    def __init__(self, model, kv_caches, *, device: torch.device, block_size: int, max_model_len: int,
                 max_num_seqs: int, capture: bool = True):
        self.model, self.kv_caches, self.device = model, kv_caches, device
        self.sizes = capture_sizes(max_num_seqs)
        self.max_seq_len = min(max_model_len, MAX_SEQ_LEN_TO_CAPTURE)
        largest = self.sizes[-1]
        max_blocks = -(-self.max_seq_len // block_size)
        self.input_ids = torch.zeros(largest, dtype=torch.int64, device=device)
        self.positions = torch.zeros(largest, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((largest,), -1, dtype=torch.int64, device=device)
        self.block_tables = torch.zeros(largest, max_blocks, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(largest, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        if capture:
            self._capture()

    def can_run(self, num_seqs: int, max_seq_len: int, max_blocks: int) -> bool:
        return (num_seqs <= self.sizes[-1] and max_seq_len <= self.max_seq_len
                and max_blocks <= self.block_tables.shape[1])

    def _meta(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:size], num_prefill_tokens=0, prefill_cu_seqlens=[0],
            prefill_context_lens=[], prefill_block_tables=None,
            decode_block_tables=self.block_tables[:size], decode_seq_lens=self.seq_lens[:size],
            decode_max_seq_len=self.max_seq_len, checked=True)

    def _forward(self, size: int) -> torch.Tensor:
        return self.model(self.input_ids[:size], self.positions[:size], self.kv_caches, self._meta(size))

    def _capture(self) -> None:
        pool = None
        # Largest first, all in one memory pool: each smaller graph reuses the larger one's memory.
        with torch.inference_mode():
            for size in reversed(self.sizes):
                self._forward(size)           # warm-up: lazy initialization stays out of the graph
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.outputs[size] = self._forward(size)
                pool = graph.pool()
                self.graphs[size] = graph
        torch.cuda.synchronize(self.device)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
            block_tables: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        """Hidden states [num_seqs, hidden] of one decode step (inputs already on the device)."""
        num_seqs, width = block_tables.shape
        size = graph_batch_size(num_seqs)
        self.input_ids[:num_seqs].copy_(input_ids)
        self.positions[:num_seqs].copy_(positions)
        self.slot_mapping[:num_seqs].copy_(slot_mapping)
        self.block_tables[:num_seqs, :width].copy_(block_tables)
        self.seq_lens[:num_seqs].copy_(seq_lens)
        if size > num_seqs:
            # Padding rows: store nothing, attend to one token of block 0.
            self.slot_mapping[num_seqs:size].fill_(-1)
            self.seq_lens[num_seqs:size].fill_(1)
            self.block_tables[num_seqs:size, 0].fill_(0)
        if size in self.graphs:
            self.graphs[size].replay()
            return self.outputs[size][:num_seqs]
        return self._forward(size)[:num_seqs]
