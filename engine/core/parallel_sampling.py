"""vLLM v1's parallel sampling: a request asking for n > 1 samples runs as n independent child requests.

vLLM v1's scheduler holds one sequence per request, so its front end fans a request with
``n > 1`` out above the scheduler (vllm/v1/engine/parallel_sampling.py, ``ParentRequest``):
child ``i`` is request ``f"{i}_{request_id}"`` with ``n = 1`` and, when the parent has a seed,
``seed + i``; the children share the prompt through the prefix cache (the first child's full
prompt blocks are cached as it is scheduled, and the others hit them), and their outputs are
gathered into one ``RequestOutput`` with the n completions in child order. The live engine
(engine/llm_engine.py) and the simulator (planner/sim/engine.py) both fan out here, under the
vllm-v1 policy only: the paper's scheduler forks sequences inside one group instead.

Metrics count the request the user sent, as a client (vLLM's ``bench serve``) measures it: its
TTFT is its first child's first token (the first token a streaming client receives) and its E2E
latency its last child's finish (when the gathered output is returned, as vLLM's non-streamed
``FINAL_ONLY`` output is); completed + rejected still equals submitted. vLLM's own server
histograms observe every child as a request (and only the longest child's generation length and
``n`` once per parent, ``ParentRequest.observe_finished_request``): so do `planner serve`'s, from
the children's records a parent's ``RequestOutput.child_metrics`` carries.

vLLM v1 has neither beam search in its scheduler nor ``best_of > n``: those are refused.
"""
from __future__ import annotations

from dataclasses import replace

from engine.core.sampling_params import SamplingParams
from engine.core.sequence import FinishReason, RequestTimes, SequenceGroup

BEAM_SEARCH_REFUSAL = ("beam search is not supported by the vllm-v1 policy (vLLM v1 has no beam search in its "
                       "scheduler); run it with --policy paper")
BEST_OF_REFUSAL = ("best_of > n is not supported by the vllm-v1 policy (vLLM v1 removed best_of); ask for n "
                   "samples, or run it with --policy paper")


def refusal(params: SamplingParams) -> str | None:
    """Why the vllm-v1 policy cannot run a request with these parameters (one line), or None."""
    if params.use_beam_search:
        return BEAM_SEARCH_REFUSAL
    if params.best_of > params.n:
        return BEST_OF_REFUSAL
    return None


def fans_out(params: SamplingParams) -> bool:
    """Whether vLLM v1 runs this request as n child requests (n > 1, and nothing refused)."""
    return params.n > 1 and refusal(params) is None


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    """Child `index`'s parameters: one sample, and its own seed when the parent has one
    (ParentRequest._get_child_sampling_params)."""
    seed = None if params.seed is None else params.seed + index
    return replace(params, n=1, best_of=1, seed=seed)


def child_id(request_id: str, index: int) -> str:
    """vLLM's child request id (ParentRequest.get_child_info)."""
    return f"{index}_{request_id}"


class ParentRequest:
    """The request the user sent, over its n child requests: it reads as one SequenceGroup does for
    records and watchers (request id, params, times, finish reason, outputs), while the scheduler
    sees only the children."""

    __slots__ = ("request_id", "params", "children", "arrival_time", "_prompt", "output_len_hint", "priority",
                 "lora_id", "lora_name", "cache_salt")

    def __init__(self, template: SequenceGroup) -> None:
        self.request_id = template.request_id
        self.params = template.params
        self.arrival_time = template.arrival_time
        self._prompt = template.prompt_token_ids
        self.output_len_hint = template.output_len_hint
        self.priority = template.priority
        self.lora_id = template.lora_id          # every child runs (and keys its prefix blocks) with its adapter
        self.lora_name = template.lora_name
        self.cache_salt = template.cache_salt
        self.children = [SequenceGroup(child_id(self.request_id, i), list(self._prompt),
                                       child_params(self.params, i), template.arrival_time,
                                       eos_token_ids=template.eos_token_ids,
                                       output_len_hint=template.output_len_hint, priority=template.priority,
                                       lora_id=template.lora_id, lora_name=template.lora_name,
                                       cache_salt=template.cache_salt)
                         for i in range(self.params.n)]

    @property
    def num_cached_tokens(self) -> int:
        """The first child's (the others share its prompt blocks)."""
        return self.children[0].num_cached_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self._prompt

    @property
    def prompt_len(self) -> int:
        return len(self._prompt)

    @property
    def seqs(self) -> list:
        return [seq for child in self.children for seq in child.seqs]

    @property
    def times(self) -> RequestTimes:
        """The request's times: first child scheduled and first token, last child's finish, and every
        step any child produced a token in."""
        kids = [c.times for c in self.children]
        firsts = [t.first_token for t in kids if t.first_token is not None]
        scheduled = [t.first_scheduled for t in kids if t.first_scheduled is not None]
        finish = None if any(t.finish is None for t in kids) else max(t.finish for t in kids)
        return RequestTimes(self.arrival_time, min(scheduled, default=None), min(firsts, default=None),
                            sorted({x for t in kids for x in t.token_times}), finish)

    @property
    def finish_reason(self) -> FinishReason | None:
        """None until every child has ended; rejected if any child was; else the first child's."""
        reasons = [c.finish_reason for c in self.children]
        if any(r is None for r in reasons):
            return None
        return FinishReason.REJECTED if FinishReason.REJECTED in reasons else reasons[0]

    @property
    def reject_reason(self) -> str | None:
        return next((c.reject_reason for c in self.children if c.reject_reason is not None), None)

    @property
    def num_preemptions(self) -> int:
        return sum(c.num_preemptions for c in self.children)

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def first_step_pending(self) -> bool:
        return all(c.first_step_pending for c in self.children)

    def num_output_tokens(self) -> int:
        return sum(c.num_output_tokens() for c in self.children)

    def outputs(self) -> list:
        """The n completions in child order, as SequenceGroup.outputs gives them."""
        return [out for child in self.children for out in child.outputs()]


class Parents:
    """The parents of the child requests in flight, by child: turns the children that ended into the
    requests that ended (a parent when its last child ends; any other request as it is)."""

    def __init__(self) -> None:
        self.by_child: dict[int, ParentRequest] = {}
        self.left: dict[int, int] = {}         # by parent: its children not yet ended

    def fan_out(self, group: SequenceGroup, add) -> ParentRequest:
        """`group` as its n child requests, each handed to `add` (a scheduler's); the parent, followed."""
        parent = ParentRequest(group)
        for child in parent.children:
            self.by_child[id(child)] = parent
            add(child)
        self.left[id(parent)] = len(parent.children)
        return parent

    def ended(self, groups: list[SequenceGroup]) -> list:
        if not self.by_child:
            return groups
        found = []
        for group in groups:
            parent = self.by_child.pop(id(group), None)
            if parent is None:
                found.append(group)
                continue
            self.left[id(parent)] -= 1
            if not self.left[id(parent)]:
                del self.left[id(parent)]
                found.append(parent)
        return found
