"""ModelRunner: turns one scheduled step (plain Python ints) into tensors, runs the model, returns logits.

The scheduler and block manager speak in token ids, positions and block ids;
this is the only place that converts them to tensors. A step's sequences are
packed without padding, prefills first and decodes after (the layout
``engine.attention`` expects); the returned logits are put back in the
caller's order.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from itertools import accumulate, chain
from pathlib import Path

import torch

import cuda_ext
from cuda_ext.checks import CUDA_HEAD_SIZES
from engine import sampling
from engine.attention import AttentionMetadata, PagedAttention
from engine.cuda_graphs import MAX_SEQ_LEN_TO_CAPTURE, DecodeGraphs
from engine.deployment import BatchDevice
from engine.host_memory import keep_host_buffers
from engine.kv_cache import KVCache, bytes_per_block, cache_dtype, num_blocks_for_budget, profile_num_gpu_blocks
from engine.lora import LoRAManager, LoRARequest
from engine.models import load_model, resolve_device
from engine.models.loader import read_config

# KV budget when running on the CPU and the caller gave neither a block count
# nor a byte budget: large enough for tests and demos, small enough for a laptop.
DEFAULT_CPU_KV_CACHE_BYTES = 1 << 30
# Swap pool cap when the "device" is the host itself (its swap pool mirrors host memory).
CPU_SWAP_CAP = 512 << 20
# The scheduler's default step budget (SchedulerConfig): max(max_model_len, this).
MIN_DEFAULT_BATCHED_TOKENS = 2048


@dataclass
class SequenceInput:
    """One sequence's work this step."""

    token_ids: list[int]  # the NEW tokens to compute (uncached prompt tokens, or the last generated token)
    start_pos: int  # tokens of this sequence already in the KV cache
    block_table: list[int]  # physical blocks covering positions [0, start_pos + len(token_ids))
    lora_id: int = 0  # the LoRA adapter its tokens run with (engine.lora; 0: the base model alone)

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


def packed_order(seqs: list[SequenceInput]) -> tuple[list[int], int]:
    """The order a step packs its sequences in (the indices: prefills first, then decodes, each as given),
    and how many prefills lead."""
    prefill = [i for i, s in enumerate(seqs) if s.is_prefill]
    return prefill + [i for i, s in enumerate(seqs) if not s.is_prefill], len(prefill)


def batch_device(device: str | torch.device = "auto") -> BatchDevice:
    """What vLLM's batch defaults read of the device the engine will run on (engine.deployment.
    vllm_batch_defaults): the CPU, or the CUDA device's total memory and name."""
    device = resolve_device(device)
    if device.type != "cuda":
        return BatchDevice(is_cpu=True)
    props = torch.cuda.get_device_properties(device)
    return BatchDevice(memory_bytes=props.total_memory, name=props.name)


def model_positions(model_path: str) -> int:
    """The longest context the checkpoint was built for (its config's max_position_embeddings)."""
    return read_config(model_path).max_position_embeddings


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
        max_model_len: int | None = None,
        max_num_seqs: int = 256,
        enforce_eager: bool = False,
        kv_cache_dtype: str = "auto",
        weights_of: ModelRunner | None = None,
        enable_lora: bool = False,
        max_loras: int = 1,
        max_lora_rank: int = 16,
    ):
        """Load the model and allocate the KV cache.

        Cache size: ``num_gpu_blocks`` if given; else ``kv_cache_memory_bytes``
        worth of blocks; else, on CUDA, what fits in ``gpu_memory_utilization``
        of the device after a profiling pass of the largest step the engine
        may run: ``max_num_batched_tokens`` prompt tokens (default, as the
        scheduler's: max(max_model_len, 2048)) over ``max_num_seqs`` sequences,
        and the sampler on ``max_num_seqs`` rows; else (CPU)
        DEFAULT_CPU_KV_CACHE_BYTES. ``max_model_len`` caps the model's own
        limit. Swap pool: ``num_cpu_blocks``, or as many blocks as
        ``swap_space_bytes`` holds. On CUDA, decode steps replay CUDA graphs
        (``engine.cuda_graphs``) unless ``enforce_eager``. ``kv_cache_dtype``:
        vLLM's "auto" (the model's dtype) or "fp8" (E4M3, a byte per element).
        ``weights_of``: a runner of the same model on this device whose loaded
        model this one runs, beside a KV cache of its own, instead of loading a
        copy (``dtype`` is then that model's). A profile timed along a live run
        times the engine's own weights so: on the 2-core VM a second copy of
        opt-125m, placed elsewhere in memory, ran its decode steps 3-15% slower.
        ``enable_lora``: serve LoRA adapters (engine.lora), at most ``max_loras`` in a step, of rank at
        most ``max_lora_rank``; a sequence's adapter is its ``SequenceInput.lora_id``. Off, the model
        runs as loaded, with nothing added to any layer.
        """
        # Seeds torch's global RNG; sampling uses its own per-request generators.
        torch.manual_seed(seed)
        self.device = resolve_device(device)
        if self.device.type == "cpu":
            keep_host_buffers()
        if weights_of is None:
            self.model, self.config = load_model(model_path, dtype, self.device)
        elif os.path.realpath(weights_of.model_path) != os.path.realpath(model_path):
            raise ValueError(f"weights_of runs {weights_of.model_path}, not {model_path}")
        elif weights_of.device != self.device:
            raise ValueError(f"cannot run the weights of a model on {weights_of.device} on {self.device}")
        else:
            self.model, self.config = weights_of.model, weights_of.config
        self.model_path = model_path
        self.dtype = next(self.model.parameters()).dtype
        self.cache_dtype, self.block_size = cache_dtype(kv_cache_dtype, self.dtype), block_size
        self.vocab_size = self.config.vocab_size
        model_limit = self.config.max_position_embeddings
        self.max_model_len = min(max_model_len or model_limit, model_limit)
        self.max_num_seqs, self.eos_token_ids = max_num_seqs, _eos_token_ids(self.config, model_path)
        self.eos_token_id = self.eos_token_ids[0] if self.eos_token_ids else None
        layers = [m for m in self.model.modules() if isinstance(m, PagedAttention)]
        # (num_layers, num_kv_heads, head_size): what one KV block spans.
        self.cache_shape = (len(layers), layers[0].num_kv_heads, layers[0].head_size)
        self.ops = self._load_kernels()
        num_gpu_blocks = self._num_gpu_blocks(num_gpu_blocks, kv_cache_memory_bytes, gpu_memory_utilization,
                                              max_num_batched_tokens)
        if swap_space_bytes is not None:
            num_cpu_blocks = self._num_swap_blocks(swap_space_bytes)
        self.num_gpu_blocks, self.num_cpu_blocks = num_gpu_blocks, num_cpu_blocks
        self.kv_cache = KVCache(*self.cache_shape, block_size, num_gpu_blocks, num_cpu_blocks, self.cache_dtype,
                                self.device)
        # Hooked before the graphs are captured: the hooks do nothing outside a step that runs an adapter.
        self.lora = LoRAManager(self.model, self.device, self.dtype, max_loras, max_lora_rank) if enable_lora \
            else None
        self.graphs = self._decode_graphs(layers, enforce_eager)

    def _load_kernels(self):
        """This device's kernels, loaded (or built) now: a GPU whose CUDA kernels do
        not build, or do not cover the model's head size, fails here, loudly, not at
        the first step."""
        ops = cuda_ext.ops_for(self.device)
        if ops.backend == "cuda" and self.cache_shape[2] not in CUDA_HEAD_SIZES:
            raise ValueError(f"head size {self.cache_shape[2]} is not supported by the CUDA kernels "
                             f"({', '.join(map(str, CUDA_HEAD_SIZES))}); run on the CPU (device='cpu') "
                             "or use the torch reference (PAGED_KERNELS=torch)")
        return ops

    def _num_gpu_blocks(self, num_gpu_blocks: int | None, kv_cache_memory_bytes: int | None,
                        gpu_memory_utilization: float, max_num_batched_tokens: int | None) -> int:
        """The KV cache's block count, as ``__init__`` documents: given, from a byte
        budget, or (CUDA, no budget) profiled from the memory the largest step leaves."""
        if num_gpu_blocks is None:
            if kv_cache_memory_bytes is None and self.device.type == "cuda":
                num_gpu_blocks = profile_num_gpu_blocks(
                    self, gpu_memory_utilization,
                    max_num_batched_tokens or max(self.max_model_len, MIN_DEFAULT_BATCHED_TOKENS),
                )
            else:
                budget = kv_cache_memory_bytes if kv_cache_memory_bytes is not None else DEFAULT_CPU_KV_CACHE_BYTES
                num_gpu_blocks = num_blocks_for_budget(budget, *self.cache_shape, self.block_size, self.cache_dtype)
        if num_gpu_blocks <= 0:
            raise ValueError("the KV cache would hold no blocks; give a larger budget")
        return num_gpu_blocks

    def _num_swap_blocks(self, swap_space_bytes: int) -> int:
        """Blocks of the CPU swap pool that ``swap_space_bytes`` holds."""
        if self.device.type != "cuda":
            # Without a separate device both pools live in host memory.
            swap_space_bytes = min(swap_space_bytes, CPU_SWAP_CAP)
        return swap_space_bytes // bytes_per_block(*self.cache_shape, self.block_size, self.cache_dtype)

    def _decode_graphs(self, layers: list[PagedAttention], enforce_eager: bool) -> DecodeGraphs | None:
        """CUDA graphs for decode steps, or None where they cannot be captured."""
        windows = [layer.sliding_window for layer in layers if layer.sliding_window is not None]
        # A window shorter than a context makes decode gather on the host: not capturable; nor is a
        # model that says so (``cuda_graphs = False``: MoE models read expert token counts on the host).
        if self.device.type == "cuda" and not enforce_eager and getattr(self.model, "cuda_graphs", True) and \
                min(windows, default=self.max_model_len) >= min(self.max_model_len, MAX_SEQ_LEN_TO_CAPTURE):
            return DecodeGraphs(self.model, self.kv_cache.gpu, device=self.device, block_size=self.block_size,
                                max_model_len=self.max_model_len, max_num_seqs=self.max_num_seqs)
        return None

    # -- LoRA adapters --
    def add_lora(self, request: LoRARequest) -> bool:
        """Load an adapter (once per lora_int_id); True if it was not loaded yet. A ValueError in one line
        for one this runner cannot serve (or when LoRA is off)."""
        if self.lora is None:
            raise ValueError(f"LoRA adapter {request.lora_name!r} given but LoRA is off: give enable_lora=True "
                             f"(vLLM's --enable-lora)")
        return self.lora.add(request)

    def remove_lora(self, lora_id: int) -> bool:
        return self.lora is not None and self.lora.remove(lora_id)

    def lora_request(self, lora_id: int) -> LoRARequest | None:
        """The loaded adapter of id `lora_id`, if any."""
        loaded = None if self.lora is None else self.lora.adapters.get(lora_id)
        return None if loaded is None else loaded.request

    def list_loras(self) -> set[int]:
        return set() if self.lora is None else set(self.lora.adapters)

    def _forward(self, input_ids, positions, meta, lora_ids: list[int] | None,
                 token_counts: list[int] | None = None):
        """The model's forward pass over the packed batch, with the sequences' LoRA adapters applied when
        any has one (``lora_ids``, ``token_counts``: per packed sequence; no counts: one token each)."""
        if not lora_ids or not any(lora_ids):
            return self.model(input_ids, positions, self.kv_cache.gpu, meta)
        with self.lora.applied(lora_ids, token_counts):
            return self.model(input_ids, positions, self.kv_cache.gpu, meta)

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
        order, num_prefills = packed_order(seqs)
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
        if all(len(s.token_ids) == 1 and s.start_pos > 0 for s in seqs):
            return self._execute_decode(seqs)
        lora_ids = token_counts = None
        if self.lora is not None:   # each packed sequence's adapter, in prepare's order
            ordered = [seqs[i] for i in packed_order(seqs)[0]]
            lora_ids, token_counts = [s.lora_id for s in ordered], [len(s.token_ids) for s in ordered]
        with torch.inference_mode():
            input_ids, positions, meta, last_rows = self.prepare(seqs)
            hidden = self._forward(input_ids, positions, meta, lora_ids, token_counts)
            return self._logits(hidden[last_rows], len(seqs))

    def _execute_decode(self, seqs: list[SequenceInput]) -> torch.Tensor:
        """A decode-only step (the common one), with as little host work as possible.

        Every row computes one token, so the rows need no reordering and the
        logits are the hidden states' rows as they are. The block ids and
        slots are checked here once for the step, so the kernels skip their
        per-layer value checks (``AttentionMetadata.checked``). On CUDA the
        step replays a captured graph when one fits.
        """
        bs, num_seqs = self.block_size, len(seqs)
        tables = [s.block_table for s in seqs]
        starts = [s.start_pos for s in seqs]
        width = max(map(len, tables))
        for table, start in zip(tables, starts):
            if len(table) * bs <= start:
                raise ValueError(f"block_table of {len(table)} blocks cannot hold {start + 1} tokens")
        if max(map(max, tables)) >= self.num_gpu_blocks or min(map(min, tables)) < 0:
            raise ValueError(f"a block table holds a block id outside [0, {self.num_gpu_blocks})")
        ids = [s.token_ids[0] for s in seqs]
        slots = [table[start // bs] * bs + start % bs for table, start in zip(tables, starts)]
        rows = [table + [0] * (width - len(table)) for table in tables]
        max_seq_len = max(starts) + 1
        graphs = self.graphs
        # The graphs were captured without adapters: a step that runs one is eager.
        lora_ids = [s.lora_id for s in seqs] if self.lora is not None and any(s.lora_id for s in seqs) else None
        with torch.inference_mode():
            if graphs is not None and lora_ids is None and graphs.can_run(num_seqs, max_seq_len, width):
                hidden = graphs.run(*self._decode_tensors(ids, starts, slots, rows))
                return self.model.compute_logits(hidden).float()
            pad = self._row_pad(num_seqs)
            if pad:
                ids, starts, slots, rows = ids + [0] * pad, starts + [0] * pad, slots + [-1] * pad, \
                    rows + [[0] * width] * pad
                if lora_ids is not None:   # dummy rows run the base model
                    lora_ids = lora_ids + [0] * pad
            input_ids, positions, slot_mapping, block_tables, seq_lens = self._decode_tensors(ids, starts, slots, rows)
            meta = AttentionMetadata(
                slot_mapping=slot_mapping, num_prefill_tokens=0, prefill_cu_seqlens=[0], prefill_context_lens=[],
                prefill_block_tables=None, decode_block_tables=block_tables, decode_seq_lens=seq_lens,
                decode_max_seq_len=max_seq_len, checked=True)
            hidden = self._forward(input_ids, positions, meta, lora_ids)
            return self._logits(hidden, num_seqs)

    def _row_pad(self, rows: int) -> int:
        """Dummy rows that round a CPU batch up to a multiple of 4.

        CPU BLAS kernels work on row tiles: a matmul of 3, 7 or 11 rows is slower
        than one of 4, 8 or 12 (measured on opt-125m: decode batch 7 took 102 ms,
        batch 8 83 ms). Padding makes steps faster and their cost smooth in the
        batch size, which the calibrated cost model relies on. One row is a
        matrix-vector product, fast as it is.
        """
        return -rows % 4 if self.device.type == "cpu" and rows > 1 else 0

    def _logits(self, hidden: torch.Tensor, n: int) -> torch.Tensor:
        """fp32 logits of the first n rows of `hidden`, the LM head (the largest matmul of a small
        model) run over the rows padded as _row_pad says."""
        pad = self._row_pad(n) - (hidden.shape[0] - n)
        if pad > 0:
            hidden = torch.cat([hidden, hidden.new_zeros(pad, hidden.shape[1])])
        logits = self.model.compute_logits(hidden)
        return (logits[:n] if logits.shape[0] != n else logits).float()

    def _decode_tensors(self, ids, starts, slots, rows):
        """Device tensors of a decode step: input ids, positions, slots, block tables, context lengths."""
        positions = torch.tensor(starts, dtype=torch.int64)
        return (self._to_device(torch.tensor(ids, dtype=torch.int64)), self._to_device(positions),
                self._to_device(torch.tensor(slots, dtype=torch.int64)),
                self._to_device(torch.tensor(rows, dtype=torch.int32)),
                self._to_device((positions + 1).to(torch.int32)))

    def profile_run(self, num_tokens: int, num_seqs: int | None = None) -> None:
        """The heaviest step the scheduler may issue, without a KV cache: used to measure peak memory.

        ``num_tokens`` prompt tokens spread over ``num_seqs`` sequences
        (default: the runner's max_num_seqs; more if a sequence would exceed
        max_model_len), then the sampler's heaviest path (top-k and top-p
        over the whole vocabulary, plus logprobs) on one row per sequence.
        """
        num_seqs = max(1, min(num_seqs or self.max_num_seqs, num_tokens))
        num_seqs = max(num_seqs, -(-num_tokens // self.max_model_len))
        lens = [num_tokens // num_seqs + (i < num_tokens % num_seqs) for i in range(num_seqs)]
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
            logits = self.model.compute_logits(hidden[torch.tensor(cu[1:], device=self.device) - 1]).float()
            del hidden
            generator = sampling.make_generator(0, self.device)
            sampling.logprobs(logits)
            sampling.sample(logits, 1.0, self.vocab_size - 1, 0.99, generator)
