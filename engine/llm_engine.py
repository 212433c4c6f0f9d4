"""LLMEngine: the online engine. One step is schedule -> execute -> update.

The clock is read here and passed to the core, so a trace can be replayed
against the wall clock with its real arrival times (``arrival_time``), and the
same per-request and per-step records come out as in the simulator.
"""
from __future__ import annotations

import operator
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from engine import sampling
from engine.core.block_keys import BAD_CACHE_SALT, bad_cache_salt, cache_root
from engine.core.block_manager import BlockManager
from engine.core.config import SUPPORTED_BLOCK_SIZES, check_block_size
from engine.core.kv_allocator import AllocStatus
from engine.core.metrics import RequestRecord, StepRecord
from engine.core.parallel_sampling import ParentRequest, Parents, fans_out, refusal
from engine.detokenizer import IncrementalDetokenizer
from engine.model_runner import ModelRunner, SequenceInput, batch_device, model_positions
from engine.outputs import CompletionOutput, Logprob, PositionLogprobs, RequestOutput
from engine.sampler import Sampler
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import SchedulerOutput
from engine.core.chunked_scheduler import VllmBlockManager, make_scheduler
from engine.core.sequence import FinishReason, Sequence, SequenceGroup, SequenceStatus
from engine.core.speculative import SpecDecodingStats, SpeculativeConfig
from engine.core.step import begin_step, end_step
from engine.deployment import Deployment, parse_speculative, resolve_batch_limits
from engine.draft_model import DraftModelProposer
from engine.kv_cache import GiB
from engine.lora import LoRARequest

__all__ = ["LLMEngine", "StepError", "SUPPORTED_BLOCK_SIZES"]

Prompt = str | dict | list[int]


def has_tokenizer(folder: str | Path) -> bool:
    return any((Path(folder) / name).exists() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json"))


def load_tokenizer(folder: str | Path):
    """The folder's tokenizer, if it has one (never downloads)."""
    if not has_tokenizer(folder):
        return None
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def _check_cache_holds_one_sequence(max_model_len: int, cache_tokens: int) -> None:
    """Refuse to start, as vLLM does, when one sequence at the context limit would not fit: requests
    would otherwise be cut short (or refused) for lack of blocks, never for their length."""
    if max_model_len > cache_tokens:
        # vLLM's words (vllm/v1/core/kv_cache_utils.py, check_enough_kv_cache_memory).
        raise ValueError(f"The model's max seq len ({max_model_len}) is larger than the maximum number of tokens "
                         f"that can be stored in KV cache ({cache_tokens}): lower max_model_len to "
                         f"{cache_tokens} or give the KV cache more blocks")


def _tag_loras(out: SchedulerOutput, inputs: list[SequenceInput]) -> None:
    """Each scheduled sequence's input gets its request's adapter, which the runner applies."""
    lora_of = {seq.seq_id: group.lora_id for group in out.groups for seq in group.seqs}
    for seq, item in zip(out.seqs, inputs):
        item.lora_id = lora_of[seq.seq_id]


class StepError(RuntimeError):
    """An engine step failed. Only the requests it ran were ended (finish reason "error");
    ``outputs`` holds them, and the engine is ready for the next step."""

    def __init__(self, cause: Exception, outputs: list[RequestOutput]) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause
        self.outputs = outputs


def check_runnable(dep: Deployment, model: str) -> None:
    """A ValueError in one line for a deployment this engine cannot run (what only the planner models)."""
    check_block_size(dep.block_size, SUPPORTED_BLOCK_SIZES)   # what the kernels are built for
    if dep.tp != 1:
        raise ValueError(f"tensor parallel size {dep.tp}: this engine runs a model on one device "
                         "(the planner models parallelism: planner simulate --tp N)")
    if dep.pp != 1:
        raise ValueError(f"pipeline parallel size {dep.pp}: this engine runs every layer on one device "
                         "(the planner models pipeline parallelism: planner simulate --pp N)")
    if dep.dp != 1:
        raise ValueError(f"data parallel size {dep.dp}: this engine runs one attention replica "
                         "(the planner models data parallelism: planner simulate --dp N)")
    if dep.allocator != "paged":
        raise ValueError(f"allocator {dep.allocator!r} is one of the paper's baselines, which only the "
                         "simulator runs; the engine is paged")
    if dep.async_scheduling:
        raise ValueError("async scheduling: this engine schedules each step after the last one ends; the "
                         "planner prices vLLM's --async-scheduling (planner simulate --async-scheduling)")
    if dep.quantization is not None:
        raise ValueError(f"quantization {dep.quantization!r}: this engine runs 16/32-bit weights; the planner "
                         f"prices quantized deployments (planner simulate --quantization {dep.quantization})")
    if dep.cpu_offload_gb:
        raise ValueError(f"cpu_offload_gb {dep.cpu_offload_gb:g}: this engine keeps its weights where its device "
                         f"reads them; the planner prices vLLM's --cpu-offload-gb (planner simulate --cpu-offload-gb)")
    if not Path(model, "config.json").exists():
        raise ValueError(f"{model}: not a model folder (no config.json); give a local Hugging Face "
                         f"checkpoint folder")


def _deployment_speculation(dep: Deployment) -> SpeculativeConfig | None:
    """The deployment's --speculative METHOD:K as vLLM's speculative_config (its prompt-lookup defaults; a
    draft model from --draft-model), so `planner serve` and `validate` run what the deployment says; the
    engine proposes by n-gram or a draft model (EAGLE and MTP heads only the planner simulates)."""
    if dep.speculative is None:
        return None
    method, k = parse_speculative(dep.speculative)
    if method == "draft":
        if dep.draft_model is None:
            raise ValueError(f"--speculative {dep.speculative}: give the draft model's folder (--draft-model)")
        return SpeculativeConfig("draft_model", k, model=dep.draft_model)
    if method != "ngram":
        raise ValueError(f"--speculative {dep.speculative}: this engine speculates with ngram or a draft model "
                         f"only (the planner simulates {method}: planner simulate --speculative {dep.speculative})")
    return SpeculativeConfig(num_speculative_tokens=k)


class LLMEngine:
    """The engine over the model folder `model`, served as `deployment` says (or as the keyword
    arguments, vLLM's engine-argument names, say: ``LLMEngine(folder, block_size=16, max_num_seqs=64)``).

    The rest are runtime options, not deployment settings: the device, the sampler's seed, a tokenizer
    folder, CUDA graphs off, the clock and a step observer. (A CPU run's KV cache is 1 GiB unless the
    deployment's ``kv_cache_memory_bytes`` or ``num_gpu_blocks`` says otherwise.)
    ``speculative_config`` (vLLM's, e.g. ``{"method": "ngram", "num_speculative_tokens": 4}``) turns on
    speculative decoding (docs/speculative.md); None, the default, takes the deployment's ``speculative``
    (off unless it says ``ngram:K``). ``weights_of``: another engine's runner whose loaded model this one
    runs, on a KV cache of its own (ModelRunner's; the in-process replicas of a live fleet share one).
    """

    def __init__(self, model: str, deployment: Deployment | None = None, *, device: str = "auto", seed: int = 0,
                 tokenizer: str | None = None,
                 enforce_eager: bool = False, clock: Callable[[], float] = time.perf_counter,
                 step_observer: Callable[[SchedulerOutput], None] | None = None,
                 speculative_config: SpeculativeConfig | dict | None = None, weights_of: ModelRunner | None = None,
                 **knobs) -> None:
        dep = Deployment.of(deployment, **({"model": str(model)} if deployment is None else {}), **knobs)
        check_runnable(dep, model)
        dep = dep.replace(async_scheduling=False)     # this engine schedules each step after the last one ends
        positions = model_positions(model)
        if dep.max_model_len is not None and dep.max_model_len > positions:     # vLLM's ModelConfig refuses it too
            raise ValueError(f"max_model_len {dep.max_model_len} is greater than the model's {positions} positions "
                             f"(max_position_embeddings)")
        dep = resolve_batch_limits(dep, batch_device(device), dep.max_model_len or positions)
        self.deployment = dep
        self.clock = clock
        self.step_observer = step_observer
        # The vllm-v1 policy preempts by recompute only: no swap pool; its CPU pool is the offloading tier's.
        swap_bytes = int((dep.kv_offloading_size or 0) * GiB) if dep.vllm_v1 else int(dep.swap_space * GiB)
        if dep.num_cpu_blocks is not None and not dep.vllm_v1:
            swap_bytes = None                # the pool's size in blocks is given
        self.runner = ModelRunner(model, block_size=dep.block_size, num_gpu_blocks=dep.num_gpu_blocks,
                                  num_cpu_blocks=0 if dep.vllm_v1 else dep.num_cpu_blocks or 0,
                                  swap_space_bytes=swap_bytes, dtype=dep.dtype,
                                  device=device, enforce_eager=enforce_eager,
                                  kv_cache_memory_bytes=dep.kv_cache_memory_bytes, seed=seed,
                                  gpu_memory_utilization=dep.gpu_memory_utilization,
                                  max_num_batched_tokens=dep.max_num_batched_tokens,
                                  max_model_len=dep.max_model_len, max_num_seqs=dep.max_num_seqs,
                                  kv_cache_dtype=dep.kv_cache_dtype, weights_of=weights_of,
                                  enable_lora=dep.enable_lora, max_loras=dep.max_loras,
                                  max_lora_rank=dep.max_lora_rank)
        self.max_model_len = min(dep.max_model_len or self.runner.max_model_len, self.runner.max_model_len)
        if dep.vllm_v1:     # vLLM v1's block order, so prefix hits match vLLM's
            if dep.kv_offloading_size and not self.runner.num_cpu_blocks:
                raise ValueError(f"kv_offloading_size {dep.kv_offloading_size:g} GiB holds no KV block of this "
                                 f"model (give more)")
            self.allocator = VllmBlockManager(dep.block_size, self.runner.num_gpu_blocks,
                                              enable_prefix_caching=dep.enable_prefix_caching,
                                              offload_blocks=self.runner.num_cpu_blocks)
        else:
            self.allocator = BlockManager(dep.block_size, self.runner.num_gpu_blocks, self.runner.num_cpu_blocks,
                                          enable_prefix_caching=dep.enable_prefix_caching,
                                          max_model_len=self.max_model_len)
        _check_cache_holds_one_sequence(self.max_model_len, self.allocator.max_seq_len())
        self.scheduler = make_scheduler(dep.scheduler_config(self.max_model_len), self.allocator)
        self.speculative_config = SpeculativeConfig.of(speculative_config) or _deployment_speculation(dep)
        if self.speculative_config is not None:
            self.scheduler.enable_speculation(self.speculative_config)
            if self.speculative_config.method == "draft_model":
                self.scheduler.proposer = DraftModelProposer(
                    self.speculative_config.model, self.speculative_config.num_speculative_tokens,
                    self.scheduler.config.max_model_len, self.scheduler.spec_stats,
                    vocab_size=self.runner.vocab_size, device=self.runner.device, dtype=self.runner.dtype)
        self.sampler = Sampler(self.runner.device, seed)
        self.tokenizer = load_tokenizer(tokenizer or model)
        if tokenizer and self.tokenizer is None:
            raise ValueError(f"{tokenizer}: no tokenizer files (tokenizer.json, tokenizer_config.json) there")
        # The requests by id: a SequenceGroup, or under vllm-v1 a ParentRequest over the n child requests
        # the scheduler runs for it (engine/core/parallel_sampling.py).
        self.groups: dict[str, SequenceGroup | ParentRequest] = {}
        self.parents = Parents()
        self.prompts: dict[str, str | None] = {}
        self.steps: list[StepRecord] = []
        # Whether each step's record is kept in `steps` (a run's, for validation and profiling). A server
        # turns it off: it would grow by a record a step for as long as the server lives.
        self.keep_steps = True
        # A server sets this: every sequence's text is kept current each step so
        # it can be streamed. Requests with stop strings are detokenized each
        # step regardless, since that is where stop strings are found.
        self.stream_text = False
        self.last_step_groups: list[SequenceGroup] = []    # the requests the last step advanced
        self._step_out: SchedulerOutput | None = None      # the step running now (for a failure's reach)
        self._texts: dict[int, IncrementalDetokenizer] = {}            # by seq id
        self._logprobs: dict[int, list[PositionLogprobs]] = {}         # by seq id

    # -- requests -------------------------------------------------------------
    def _tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" not in prompt:
                raise ValueError("a dict prompt needs 'prompt_token_ids'")
            return prompt.get("prompt"), list(prompt["prompt_token_ids"])
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model folder has no tokenizer; pass {'prompt_token_ids': [...]}")
            return prompt, self.tokenizer(prompt)["input_ids"]
        return None, list(prompt)

    def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams | None = None,
                    arrival_time: float | None = None, *, output_len_hint: int | None = None,
                    priority: int = 0, lora_request: LoRARequest | None = None) -> None:
        """`priority`: vLLM's request priority, read under --scheduling-policy priority (the lower first).
        `lora_request`: the LoRA adapter the request runs with (vLLM's; needs enable_lora), loaded here the
        first time its id is seen; None: the base model. A dict prompt's `cache_salt` (vLLM's) keeps its
        prefix-cache blocks to the requests of the same salt."""
        if request_id in self.groups:
            raise ValueError(f"request id {request_id!r} is already in use")
        lora_id, lora_name = 0, ""
        if lora_request is not None:
            self.add_lora(lora_request)
            lora_id, lora_name = lora_request.lora_int_id, lora_request.lora_name
        text, token_ids = self._tokenize(prompt)
        salt = prompt.get("cache_salt") if isinstance(prompt, dict) else None
        if bad_cache_salt(salt):
            raise ValueError(BAD_CACHE_SALT)
        vocab = self.runner.vocab_size
        not_int = next((t for t in token_ids if isinstance(t, bool) or not hasattr(type(t), "__index__")), None)
        if not_int is not None:
            raise ValueError(f"token ids must be integers, got {not_int!r} ({type(not_int).__name__})")
        token_ids = [operator.index(t) for t in token_ids]      # (numpy's and torch's integers as Python's)
        bad = next((t for t in token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"token id {bad!r} is out of range: the model's vocabulary has {vocab} tokens "
                             f"(ids 0..{vocab - 1})")
        if not token_ids:
            raise ValueError("the prompt is empty")
        params = params or SamplingParams()
        if params.stop and self.tokenizer is None:     # (stop strings are matched in the detokenized text)
            raise ValueError("stop strings need the model's tokenizer, and this model folder has none: give "
                             "stop_token_ids instead")
        if params.max_tokens is None:   # vLLM's: up to the context (a prompt too long is refused on its own below)
            params = replace(params, max_tokens=max(self.max_model_len - len(token_ids), 1))
        if len(token_ids) <= self.max_model_len < len(token_ids) + params.max_tokens:
            warnings.warn(f"prompt + max_tokens exceeds the model's context (max_model_len "
                          f"{self.max_model_len}): such outputs stop at the limit with finish_reason "
                          f"'length'", stacklevel=2)
        refused = refusal(params) if self.deployment.vllm_v1 else None
        if refused is not None:
            raise ValueError(refused)
        group = SequenceGroup(request_id, token_ids, params,
                              self.clock() if arrival_time is None else arrival_time,
                              eos_token_ids=self.runner.eos_token_ids, output_len_hint=output_len_hint,
                              priority=priority, lora_id=lora_id, lora_name=lora_name, cache_salt=salt)
        self.prompts[request_id] = text
        if self.deployment.vllm_v1 and fans_out(params):   # vLLM v1: n child requests
            self.groups[request_id] = self.parents.fan_out(group, self.scheduler.add)
            return
        self.groups[request_id] = group
        self.scheduler.add(group)

    # -- LoRA adapters (vLLM's LLMEngine.add_lora / remove_lora / list_loras) ----------------------------
    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load an adapter ahead of its requests (add_request loads it too); True if it was not loaded
        yet. A ValueError in one line for an adapter the engine cannot serve, or when LoRA is off."""
        if not isinstance(lora_request, LoRARequest):
            raise ValueError(f"lora_request must be an engine.lora.LoRARequest, got {type(lora_request).__name__}")
        return self.runner.add_lora(lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        """Drop a loaded adapter; False if it was not loaded. Refused while a request runs with it. Its blocks
        leave the prefix cache (and the CPU tier): they are keyed by its name, and an adapter loaded later
        under that name (vLLM's load_inplace) must not be served KV the old weights computed (vLLM issue
        #42125, where it is)."""
        if any(part.lora_id == lora_id for g in self.groups.values()
               for part in (g.children if isinstance(g, ParentRequest) else (g,))):
            raise ValueError(f"LoRA adapter {lora_id} is in use by unfinished requests")
        loaded = self.runner.lora_request(lora_id)
        if loaded is None:
            return False
        self.runner.remove_lora(lora_id)
        self.scheduler.allocator.forget_adapter(cache_root(loaded.lora_name))
        return True

    def list_loras(self) -> set[int]:
        """The ids of the adapters loaded."""
        return self.runner.list_loras()

    def unservable(self, prompt_token_ids: list[int], params: SamplingParams) -> str | None:
        """Why the scheduler would refuse this request as it arrives (too many sequences, more KV cache
        at its largest than the whole cache holds, a policy that cannot run it), or None. Lets a server
        refuse it with a 400 instead of queueing it."""
        group = SequenceGroup("probe", prompt_token_ids, params, 0.0, eos_token_ids=self.runner.eos_token_ids)
        cfg = self.scheduler.config
        if cfg.vllm_v1:   # n > 1 runs as n requests: each must fit on its own
            refused = refusal(params)
            if refused is not None:
                return refused
            if fans_out(params):
                group = ParentRequest(group).children[0]
            return self.scheduler.never_fits(group)     # the chunked policy's own admission rule
        if group.max_num_seqs() > cfg.max_num_seqs:
            return f"asks for {group.max_num_seqs()} parallel sequences but the engine runs at most {cfg.max_num_seqs}"
        if self.allocator.can_allocate(group) is AllocStatus.NEVER:
            return (f"needs more KV cache at its largest (prompt + max_tokens, for each of its {params.best_of} "
                    f"sequences) than the whole cache holds ({self.allocator.num_gpu_blocks} blocks of "
                    f"{self.allocator.block_size} tokens)")
        return None

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Drop a request wherever it is (waiting, running, swapped) and free its blocks.

        Call it between steps. Returns what it had generated (finish reason
        "abort"), or None when the request is unknown or already finished.
        """
        group = self.groups.get(request_id)
        if group is None:
            return None
        return self._end(group, "abort")

    def _end(self, group: SequenceGroup | ParentRequest, reason: str, error: str | None = None) -> RequestOutput:
        """End a request the scheduler did not finish (an abort, a failed step): out of every queue,
        its blocks freed, its output so far returned with ``reason``."""
        sched, now = self.scheduler, self.clock()
        for part in group.children if isinstance(group, ParentRequest) else (group,):
            for queue in (sched.running, sched.swapped, sched.waiting):
                if part in queue:
                    queue.remove(part)
            for seq in part.seqs:
                if seq.status is not SequenceStatus.FINISHED:
                    self.allocator.free(seq)
                    seq.status = SequenceStatus.FINISHED
            part.times.finish = now
        try:
            output = self.output_of(group, self.prompts.get(group.request_id))
        except Exception:   # a failed step may have left a sequence's text half-updated: report no text
            output = RequestOutput(group.request_id, self.prompts.get(group.request_id), group.prompt_token_ids,
                                   [CompletionOutput(0, [], "", 0.0, None, reason)], True,
                                   RequestRecord.from_group(group))
        for o in output.outputs:
            o.finish_reason = reason
        output.finished = True
        output.error = error
        self._forget(group)
        return output

    # -- one step ---------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one engine step; returns the requests that finished in it.

        A step that fails (a bug, a device error) ends only the requests it ran, with finish
        reason "error"; it raises StepError holding their outputs, and the engine goes on."""
        self._step_out = None
        try:
            return self._step()
        except Exception as exc:
            raise StepError(exc, self._fail_step(exc)) from exc

    def _fail_step(self, exc: Exception) -> list[RequestOutput]:
        out = self._step_out
        message = f"internal error: {type(exc).__name__}: {exc}"
        if out is None:   # scheduling itself failed: no request can be trusted to be in a sound state
            ran = list(self.groups.values())
        else:             # the step's own requests, and those it preempted (their swap may not have happened)
            ran = self._owners([*out.groups, *out.preempted])
        failed = [self._end(g, "error", message) for g in ran if g.request_id in self.groups]
        if out is not None:   # what the scheduler itself ended in this step is reported as it stands
            failed += [self._finish(g) for g in self.parents.ended(out.finished_now) if g.request_id in self.groups]
        return failed

    def _owners(self, groups: list[SequenceGroup]) -> list[SequenceGroup | ParentRequest]:
        """The requests these scheduler groups belong to (a child's parent), each once, in order."""
        owners = (self.parents.by_child.get(id(g), g) for g in groups)
        return list({id(g): g for g in owners}.values())

    def _step(self) -> list[RequestOutput]:
        step = begin_step(self.scheduler, self.clock(), SequenceInput)
        out, samples, top = step.out, {}, {}
        self._step_out = out
        self.last_step_groups = self._owners(out.groups)
        if step.has_work:
            if self.step_observer is not None:
                self.step_observer(out)
            runner = self.runner
            # Swaps and copies apply even when no sequence runs, or a swapped-out
            # request's KV is lost. Order matters: a block swapped out may be
            # reused in this very step.
            if out.blocks_to_swap_out:
                runner.swap_out(out.blocks_to_swap_out)
            if out.blocks_to_swap_in:
                runner.swap_in(out.blocks_to_swap_in)
            if out.kv_loads:                 # from the CPU tier, for requests that run from the next step
                runner.swap_in(out.kv_loads)
            if out.blocks_to_copy:
                runner.copy_blocks(out.blocks_to_copy)
            if step.inputs and runner.lora is not None:
                _tag_loras(out, step.inputs)
            if step.inputs and out.spec_token_ids:
                samples, top = self._execute_speculative(out, step.inputs)
            elif step.inputs:
                logits = runner.execute(step.inputs)
                sampling = out.sampling_part()   # a partial prompt chunk samples nothing
                if sampling is not out:
                    rows = {s.seq_id: i for i, s in enumerate(out.seqs)}
                    logits = logits[[rows[s.seq_id] for s in sampling.seqs]]
                if sampling.seqs:
                    samples = self.sampler.sample(sampling, logits)
                    top = self._position_logprobs(sampling, logits, samples)
            if out.kv_stores:                # blocks this step filled, to the CPU tier
                runner.swap_out(out.kv_stores)
        end = self.clock()   # tokens are stamped when sampling returns
        finished, record = end_step(self.scheduler, step, samples, end)
        # The step ends after update, so its duration is what the profiler times and the simulator prices
        # (docs/architecture.md, "What a step's duration contains"); logprobs and text come after it.
        record.end = self.clock()
        if top:
            self._record_logprobs(out, top)
        if out.groups:
            finished += self._update_texts(out.groups, end)
        if step.has_work and self.keep_steps:
            self.steps.append(record)
        return [self._finish(g) for g in self.parents.ended(finished)]

    def _execute_speculative(self, out: SchedulerOutput, inputs: list) -> tuple[dict, dict]:
        """Run a step that verifies drafts, in one forward pass. A sequence verifying k drafts is
        sent as k + 1 one-token rows (its last token and each draft, at consecutive positions over
        the same block table): every row's key and value are cached before any attention reads the
        cache, so row j attends to the context and rows 0..j, as a decode of that token would, with
        the decode kernels, and its logits are those of position j. Sequences without drafts
        sample as usual; those with drafts keep what the sampler accepts and one token more."""
        spec = out.spec_token_ids
        rows, starts = [], []
        for seq, item in zip(out.seqs, inputs):
            starts.append(len(rows))
            if seq.seq_id in spec:
                rows += [SequenceInput([tok], item.start_pos + j, item.block_table, item.lora_id)
                         for j, tok in enumerate(item.token_ids)]
            else:
                rows.append(item)
        logits = self.runner.execute(rows)
        where = {s.seq_id: i for s, i in zip(out.seqs, starts)}
        sampling_out = out.sampling_part()   # a partial prompt chunk samples nothing
        plain = [s for s in sampling_out.seqs if s.seq_id not in spec]
        drafted = [s for s in sampling_out.seqs if s.seq_id in spec]
        seq_group = {s.seq_id: g for g in sampling_out.groups for s in g.seqs}
        # The plain sampler's greedy fast path (every row greedy, no logprobs) reports 0.0 logprobs.
        zero = all(g.params.greedy and g.params.logprobs is None
                   and g.params.samples_per_sequence(g.first_step_pending) == 1
                   for g in (seq_group[s.seq_id] for s in sampling_out.seqs))
        samples, top = {}, {}
        if plain:
            groups = list({id(seq_group[s.seq_id]): seq_group[s.seq_id] for s in plain}.values())
            plain_out = SchedulerOutput(sampling_out.is_prefill, groups, plain, len(plain))
            plain_logits = logits[[where[s.seq_id] for s in plain]]
            samples = self.sampler.sample(plain_out, plain_logits)
            top = self._position_logprobs(plain_out, plain_logits, samples)
        if drafted:
            groups = [seq_group[s.seq_id] for s in drafted]
            draft_out = SchedulerOutput(False, groups, drafted, len(drafted), spec_token_ids=spec)
            counts = [1 + len(spec[s.seq_id]) for s in drafted]
            index = [where[s.seq_id] + j for s, n in zip(drafted, counts) for j in range(n)]
            samples.update(self.sampler.verify(draft_out, logits[index], counts, zero))
        return samples, top

    @property
    def spec_decoding_stats(self) -> SpecDecodingStats | None:
        """Draft and acceptance counters since the engine started (vLLM's names), or None when
        speculative decoding is off."""
        return self.scheduler.spec_stats

    # -- logprobs and text, per sequence ---------------------------------------------
    def _position_logprobs(self, out: SchedulerOutput, logits, samples) -> dict[int, list[PositionLogprobs]]:
        """Per scheduled sequence that asked for logprobs: one dict per sampled candidate."""
        seq_group = {s.seq_id: g for g in out.groups for s in g.seqs}
        rows = [(i, seq, seq_group[seq.seq_id].params) for i, seq in enumerate(out.seqs)
                if seq_group[seq.seq_id].params.logprobs is not None
                and not seq_group[seq.seq_id].params.use_beam_search]
        if not rows:
            return {}
        logprobs = sampling.logprobs(logits[[i for i, _, _ in rows]])
        k = max(p.logprobs for _, _, p in rows)
        top_values, top_ids = logprobs.topk(k, dim=-1) if k else (None, None)
        result = {}
        for r, (_, seq, params) in enumerate(rows):
            row = logprobs[r]
            alternatives = {}
            if params.logprobs:
                for rank, (tok, lp) in enumerate(zip(top_ids[r, :params.logprobs].tolist(),
                                                     top_values[r, :params.logprobs].tolist()), 1):
                    alternatives[tok] = Logprob(lp, rank, self._token_text(tok))
            per_candidate = []
            for tok, _ in samples[seq.seq_id]:
                entry = dict(alternatives)
                if tok not in entry:
                    lp = row[tok]
                    entry[tok] = Logprob(float(lp), int((row > lp).sum()) + 1, self._token_text(tok))
                per_candidate.append(entry)
            result[seq.seq_id] = per_candidate
        return result

    def _record_logprobs(self, out: SchedulerOutput, top: dict[int, list[PositionLogprobs]]) -> None:
        scheduled = {s.seq_id for s in out.seqs}
        for group in out.groups:
            mine = [s for s in group.seqs if s.seq_id in top]
            if not mine:
                continue
            # Forked in this step (best_of > 1): not scheduled and nothing recorded yet. A sibling that
            # finished earlier is not scheduled either, but has its record (issue 27's fuzzing found it).
            forked = [s for s in group.seqs if s.seq_id not in scheduled and s.seq_id not in self._logprobs]
            if forked:   # the parent took candidate 0, child j candidate j + 1
                parent = mine[0]
                self._logprobs.setdefault(parent.seq_id, []).append(top[parent.seq_id][0])
                for j, child in enumerate(forked, 1):
                    self._logprobs[child.seq_id] = [top[parent.seq_id][j]]
            else:
                for seq in mine:
                    self._logprobs.setdefault(seq.seq_id, []).append(top[seq.seq_id][0])

    def _token_text(self, token: int) -> str | None:
        return None if self.tokenizer is None else self.tokenizer.decode([token])

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def _update_texts(self, groups: list[SequenceGroup], now: float) -> list[SequenceGroup]:
        """Detokenize the new tokens and apply stop strings; returns groups a stop string finished."""
        if self.tokenizer is None:
            return []
        finished = []
        for group in groups:
            params = group.params
            if params.use_beam_search or not (params.stop or self.stream_text):
                continue
            for seq in group.seqs:
                text = self.text_state(seq)
                added = text.update(self._decode, seq.token_ids)
                if text.check_stop(params.stop, added, params.include_stop_str_in_output):
                    if seq.status is not SequenceStatus.FINISHED:
                        self.allocator.free(seq)
                        seq.status = SequenceStatus.FINISHED
                    seq.finish_reason = FinishReason.STOP
            if group.finish_reason is None and all(s.status is SequenceStatus.FINISHED for s in group.seqs):
                group.finish_reason = group.seqs[0].finish_reason
                group.times.finish = now
                self.scheduler.running.remove(group)
                finished.append(group)
        return finished

    def text_state(self, seq: Sequence) -> IncrementalDetokenizer:
        """The sequence's incremental text (created on first use)."""
        state = self._texts.get(seq.seq_id)
        if state is None:
            state = self._texts[seq.seq_id] = IncrementalDetokenizer(seq.prompt_len)
        return state

    def seq_logprobs(self, seq: Sequence) -> list[PositionLogprobs] | None:
        """The per-position logprobs recorded so far (None when the request did not ask)."""
        return self._logprobs.get(seq.seq_id)

    def _forget(self, group: SequenceGroup | ParentRequest) -> None:
        for part in group.children if isinstance(group, ParentRequest) else (group,):
            self.sampler.forget(part)
            self.parents.by_child.pop(id(part), None)
        self.parents.left.pop(id(group), None)
        forget_draft = getattr(self.scheduler.proposer, "forget", None)    # a draft model's caches
        if forget_draft is not None:
            for seq in group.seqs:
                forget_draft(seq.seq_id)
        del self.groups[group.request_id]
        self.prompts.pop(group.request_id, None)
        for seq in group.seqs:
            self._texts.pop(seq.seq_id, None)
            self._logprobs.pop(seq.seq_id, None)

    def _finish(self, group: SequenceGroup) -> RequestOutput:
        output = self.output_of(group, self.prompts.get(group.request_id))
        self._forget(group)
        return output

    def output_of(self, group: SequenceGroup | ParentRequest, prompt: str | None = None) -> RequestOutput:
        rejected = group.finish_reason is FinishReason.REJECTED
        params = group.params
        outputs = []
        if isinstance(group, ParentRequest) and not rejected:   # the children's completions, in child order
            outputs = [self._completion(i, child.seqs[0], child) for i, child in enumerate(group.children)]
        elif rejected:
            outputs.append(CompletionOutput(0, [], "" if self.tokenizer else None, 0.0, None,
                                            FinishReason.REJECTED.value))
        elif params.use_beam_search:
            for i, (tokens, cumulative, reason, _) in enumerate(group.outputs()):
                outputs.append(CompletionOutput(i, tokens, self._detokenize(tokens), cumulative, None,
                                                reason.value if reason else None))
        else:
            seqs = group.seqs
            if params.best_of > params.n:
                seqs = sorted(seqs, key=lambda s: s.cumulative_logprob, reverse=True)[:params.n]
            for i, seq in enumerate(seqs):
                outputs.append(self._completion(i, seq, group))
        children = ([RequestRecord.from_group(c) for c in group.children]
                    if isinstance(group, ParentRequest) else None)
        cached = group.num_cached_tokens
        return RequestOutput(group.request_id, prompt, group.prompt_token_ids, outputs, group.is_finished,
                             RequestRecord.from_group(group), group.reject_reason, children,
                             cached if cached >= 0 else None)

    def _completion(self, index: int, seq: Sequence, group: SequenceGroup) -> CompletionOutput:
        tokens = seq.output_token_ids
        state = self._texts.get(seq.seq_id)
        if state is not None:
            state.update(self._decode, seq.token_ids, final=True)   # a held-back partial character
            text = state.text
        else:
            text = self._detokenize(tokens)
        reason = seq.finish_reason
        stop_reason = None
        if state is not None and state.stopped:
            stop_reason = state.stop_reason
        elif reason is FinishReason.STOP and tokens and tokens[-1] in group.params._stop_set:
            stop_reason = tokens[-1]
        logprobs = self._logprobs.get(seq.seq_id, []) if group.params.logprobs is not None else None
        return CompletionOutput(index, tokens, text, seq.cumulative_logprob, logprobs,
                                reason.value if reason else None, stop_reason)

    def _detokenize(self, tokens: list[int]) -> str | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode(tokens, skip_special_tokens=True)
