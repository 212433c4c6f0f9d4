"""ModelRunner: turns one scheduled step (plain Python ints) into tensors, runs the model, returns logits.

The scheduler and block manager speak in token ids, positions and block ids;
this is the only place that converts them to tensors. A step's sequences are
packed without padding, prefills first and decodes after (the layout
``engine.attention`` expects); the returned logits are put back in the
caller's order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import accumulate, chain
from pathlib import Path

import torch

from engine.attention import AttentionMetadata, PagedAttention
from engine.host_memory import keep_host_buffers
from engine.kv_cache import KVCache, bytes_per_block, num_blocks_for_budget, profile_num_gpu_blocks
from engine.models import load_model, resolve_device

# KV budget when running on the CPU and the caller gave neither a block count
# nor a byte budget: large enough for tests and demos, small enough for a laptop.
DEFAULT_CPU_KV_CACHE_BYTES = 1 << 30
# Swap pool cap when the "device" is the host itself (its swap pool mirrors host memory).
CPU_SWAP_CAP = 512 << 20


@dataclass
class SequenceInput:
    """One sequence's work this step."""

    token_ids: list[int]  # the NEW tokens to compute (uncached prompt tokens, or the last generated token)
    start_pos: int  # tokens of this sequence already in the KV cache
    block_table: list[int]  # physical blocks covering positions [0, start_pos + len(token_ids))

    @property
    def is_prefill(self) -> bool:
        return len(self.token_ids) > 1 or self.start_pos == 0


def _eos_token_ids(config, model_path: str) -> tuple[int, ...]:
    """EOS ids from config.json and generation_config.json (Llama 3 chat models list several)."""
    ids: list[int] = []
    sources = [getattr(config, "eos_token_id", None)]
    generation_config = Path(model_path) / "generation_config.json"
    if generation_config.exists():
        sources.append(json.loads(generation_config.read_text()).get("eos_token_id"))
    for value in sources:
        for token in value if isinstance(value, list) else [value]:
            if token is not None and token not in ids:
                ids.append(int(token))
    return tuple(ids)


class ModelRunner:
    """Owns the model and its KV cache; executes steps and block moves."""

    def __init__(
        self,
        model_path: str,
        *,
        block_size: int,
        num_gpu_blocks: int | None,
        num_cpu_blocks: int = 0,
        swap_space_bytes: int | None = None,
        dtype: str | torch.dtype = "auto",
        device: str | torch.device = "auto",
        kv_cache_memory_bytes: int | None = None,
        seed: int = 0,
        gpu_memory_utilization: float = 0.9,
        max_num_batched_tokens: int | None = None,
    ):
        """Load the model and allocate the KV cache.

        Cache size: ``num_gpu_blocks`` if given; else ``kv_cache_memory_bytes``
        worth of blocks; else, on CUDA, what fits in ``gpu_memory_utilization``
        of the device after a profiling pass of ``max_num_batched_tokens``
        tokens (default: max_model_len); else (CPU) DEFAULT_CPU_KV_CACHE_BYTES.
        Swap pool: ``num_cpu_blocks``, or as many blocks as ``swap_space_bytes`` holds.
        """
        # Seeds torch's global RNG; sampling uses its own per-request generators.
        torch.manual_seed(seed)
        self.device = resolve_device(device)
        if self.device.type == "cpu":
            keep_host_buffers()
        self.model, self.config = load_model(model_path, dtype, self.device)
        self.dtype = next(self.model.parameters()).dtype
        self.block_size = block_size
        self.vocab_size = self.config.vocab_size
        self.max_model_len = self.config.max_position_embeddings
        self.eos_token_ids = _eos_token_ids(self.config, model_path)
        self.eos_token_id = self.eos_token_ids[0] if self.eos_token_ids else None
        layers = [m for m in self.model.modules() if isinstance(m, PagedAttention)]
        # (num_layers, num_kv_heads, head_size): what one KV block spans.
        self.cache_shape = (len(layers), layers[0].num_kv_heads, layers[0].head_size)

        if num_gpu_blocks is None:
            if kv_cache_memory_bytes is None and self.device.type == "cuda":
                num_gpu_blocks = profile_num_gpu_blocks(
                    self, gpu_memory_utilization, max_num_batched_tokens or self.max_model_len
                )
            else:
                budget = kv_cache_memory_bytes if kv_cache_memory_bytes is not None else DEFAULT_CPU_KV_CACHE_BYTES
                num_gpu_blocks = num_blocks_for_budget(budget, *self.cache_shape, block_size, self.dtype)
        if num_gpu_blocks <= 0:
            raise ValueError("the KV cache would hold no blocks; give a larger budget")
        if swap_space_bytes is not None:
            if self.device.type != "cuda":
                # Without a separate device both pools live in host memory.
                swap_space_bytes = min(swap_space_bytes, CPU_SWAP_CAP)
            num_cpu_blocks = swap_space_bytes // bytes_per_block(*self.cache_shape, block_size, self.dtype)
        self.num_gpu_blocks, self.num_cpu_blocks = num_gpu_blocks, num_cpu_blocks
        self.kv_cache = KVCache(*self.cache_shape, block_size, num_gpu_blocks, num_cpu_blocks, self.dtype, self.device)

    # -- block moves (scheduler decisions, applied before the step runs) --
    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        self.kv_cache.copy_blocks(pairs)

    def swap_out(self, mapping: dict[int, int]) -> None:
        self.kv_cache.swap_out(mapping)

    def swap_in(self, mapping: dict[int, int]) -> None:
        self.kv_cache.swap_in(mapping)

    # -- one step --
    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cuda":
            # Pinned source: the copy is asynchronous and overlaps the host work that follows.
            return tensor.pin_memory().to(self.device, non_blocking=True)
        return tensor.to(self.device)

    def prepare(self, seqs: list[SequenceInput]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
        """Packed input_ids, positions, attention metadata and the rows to take logits from.

        Tensors are built on the host with a few vectorized ops (no per-token
        Python loop) and moved to the device once.
        """
        prefill = [i for i, s in enumerate(seqs) if s.is_prefill]
        order = prefill + [i for i, s in enumerate(seqs) if not s.is_prefill]
        ordered = [seqs[i] for i in order]
        bs = self.block_size
        for s in ordered:
            if not s.token_ids:
                raise ValueError("a sequence with no new tokens has nothing to compute")
            if len(s.block_table) * bs < s.start_pos + len(s.token_ids):
                raise ValueError(
                    f"block_table of {len(s.block_table)} blocks cannot hold {s.start_pos + len(s.token_ids)} tokens"
                )
        query_lens = [len(s.token_ids) for s in ordered]
        starts = [s.start_pos for s in ordered]
        cu = [0, *accumulate(query_lens)]
        max_blocks = max(len(s.block_table) for s in ordered)
        block_tables = torch.tensor(
            [s.block_table + [0] * (max_blocks - len(s.block_table)) for s in ordered], dtype=torch.int32
        )
        input_ids = torch.tensor(list(chain.from_iterable(s.token_ids for s in ordered)), dtype=torch.int64)
        # Token t of packed sequence j sits at position start_j + (t - cu_j).
        seq_of_token = torch.repeat_interleave(torch.arange(len(ordered)), torch.tensor(query_lens))
        offsets = torch.tensor(starts, dtype=torch.int64) - torch.tensor(cu[:-1], dtype=torch.int64)
        positions = torch.arange(cu[-1], dtype=torch.int64) + offsets[seq_of_token]
        slot_mapping = block_tables[seq_of_token, positions // bs].long() * bs + positions % bs

        num_prefills = len(prefill)
        decode_lens = [start + 1 for start in starts[num_prefills:]]
        block_tables = self._to_device(block_tables)
        meta = AttentionMetadata(
            slot_mapping=self._to_device(slot_mapping),
            num_prefill_tokens=cu[num_prefills],
            prefill_cu_seqlens=cu[: num_prefills + 1],
            prefill_context_lens=starts[:num_prefills],
            prefill_block_tables=block_tables[:num_prefills] if num_prefills else None,
            decode_block_tables=block_tables[num_prefills:] if decode_lens else None,
            decode_seq_lens=self._to_device(torch.tensor(decode_lens, dtype=torch.int32)) if decode_lens else None,
            decode_max_seq_len=max(decode_lens, default=0),
        )
        # The caller's i-th sequence is packed at order.index(i); take its last token.
        packed_index = [0] * len(seqs)
        for j, i in enumerate(order):
            packed_index[i] = j
        last_rows = torch.tensor([cu[j + 1] - 1 for j in packed_index], dtype=torch.int64)
        return self._to_device(input_ids), self._to_device(positions), meta, self._to_device(last_rows)

    def execute(self, seqs: list[SequenceInput]) -> torch.Tensor:
        """fp32 logits [len(seqs), vocab] at each sequence's last new token, in the order given."""
        if not seqs:
            return torch.empty(0, self.vocab_size, dtype=torch.float32, device=self.device)
        num_seqs = len(seqs)
        pad = self._decode_padding(seqs)
        if pad:
            # A decode (start_pos 1) over block 0, so it packs after the real rows.
            seqs = seqs + [SequenceInput([0], 1, [0])] * pad
        with torch.inference_mode():
            input_ids, positions, meta, last_rows = self.prepare(seqs)
            if pad:
                meta.slot_mapping[-pad:] = -1      # padding rows store nothing
            hidden = self.model(input_ids, positions, self.kv_cache.gpu, meta)
            return self.model.compute_logits(hidden[last_rows]).float()[:num_seqs]

    def _decode_padding(self, seqs: list[SequenceInput]) -> int:
        """Dummy rows that round a CPU decode batch up to a multiple of 4.

        CPU BLAS kernels work on row tiles: a matmul of 3, 7 or 11 rows is
        slower than one of 4, 8 or 12 (measured on opt-125m: batch 3 took 86 ms
        and batch 4 60 ms). Padding makes decode steps faster and their cost
        smooth in the batch size, which the calibrated cost model relies on.
        """
        if self.device.type != "cpu" or len(seqs) == 1 or any(s.is_prefill for s in seqs):
            return 0
        return -len(seqs) % 4

    def profile_run(self, num_tokens: int) -> None:
        """The heaviest step the scheduler may issue, without a KV cache: used to measure peak memory."""
        seq_len = min(self.max_model_len, num_tokens)
        lens = [seq_len] * (num_tokens // seq_len) + ([num_tokens % seq_len] if num_tokens % seq_len else [])
        cu = [0, *accumulate(lens)]
        meta = AttentionMetadata(
            slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=self.device),
            num_prefill_tokens=num_tokens,
            prefill_cu_seqlens=cu,
            prefill_context_lens=[0] * len(lens),
            prefill_block_tables=None,
            decode_block_tables=None,
            decode_seq_lens=None,
        )
        positions = torch.cat([torch.arange(n) for n in lens]).to(self.device)
        input_ids = torch.zeros(num_tokens, dtype=torch.int64, device=self.device)
        with torch.inference_mode():
            hidden = self.model(input_ids, positions, None, meta)
            self.model.compute_logits(hidden[torch.tensor(cu[1:], device=self.device) - 1]).float()
