"""A deployment's speculative decoding as the planner models it: the method, K and the
acceptance curve, with where the curve comes from; checked at planning time.

Acceptance curves (`acceptance` setting, "P1,P2,...": P(position i accepted | 1..i-1 accepted)):

- given: ``--acceptance`` (required for ngram: prompt lookup's acceptance is the workload's);
- eagle, default: EAGLE-3 (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B) on Llama-3.1-8B-Instruct, MT-bench
  (80 prompts, greedy), vLLM V1 on one H100, from the mean acceptance lengths vLLM's maintainers
  published for K = 2..7 draft tokens (vllm-project/vllm issue #20780, "Eagle 3 ... AL":
  2.36, 2.79, 3.08, 3.32, 3.46, 3.54; AL = 3.53 at K = 7 again in issue #26191). EAGLE drafts the
  same chain whatever K, so AL(K) - AL(K-1) is the share of drafts whose first K tokens were all
  accepted (vLLM's "acceptance at token K-1"): 0.43, 0.29, 0.24, 0.14, 0.08 for K = 3..7. Positions
  1 and 2 share AL(2) - 1 = 1.36; we split it assuming the conditional rate of position 2 equals
  position 3's (0.781 and 0.579). Conditional rates (0.781, 0.742, 0.742, 0.674, 0.828, 0.583,
  0.571): `EAGLE_LLAMA31_8B_MTBENCH` below.
- mtp, default: DeepSeek-V3's multi-token-prediction module, whose second-token acceptance
  "ranges between 85% and 90%" (DeepSeek-V3 Technical Report, arXiv:2412.19437, section 5.4.3):
  0.875 for position 1; more positions need ``--acceptance``.

Drafting curves (`draft_rates`, "D1,D2,..."): how often the proposer offers a draft at all. EAGLE and
MTP heads draft K tokens at every step (no curve). Prompt lookup drafts only where the context's
last n-gram occurred before, and its draft ends where the earlier occurrence's continuation does:
D1 is the share of lookups with a draft, Di the share reaching token i among those reaching i - 1.
Drafts come in runs (a sequence copying its context keeps matching until the copy ends), so
`draft_persistence` is the chance a lookup drafts right after one that drafted, and D1 the chance
after one that did not (or at a sequence's first): a two-state Markov chain per sequence.
Without it an n-gram run would draft K tokens every step and be far too optimistic on text that
seldom repeats; `validate --speculative ngram:K` measures both curves on the live engine.

Proposers that run a network (`proposer_model`): a draft model is its own catalog model; an EAGLE or
MTP head is one decoder layer of the target's width (EAGLE: a dense layer, as the EAGLE heads vLLM
loads are LlamaDecoderLayer-based; MTP: a layer of the target's own kind, a MoE layer for a MoE, as
DeepSeek-V3's MTP module) reading the target's embedding and LM head, which it shares. The simulator
prices its passes with the same kind of cost model as the target, the memory plan holds its layer's
weights and its KV in every block (planner/sim/speculative.py, planner/deploy/memory.py).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from engine.deployment import Deployment, parse_acceptance, parse_speculative
from planner.catalog import ModelSpec
from planner.deploy.checks import model as catalog_model
from planner.errors import PlannerError

# AL(K) for K = 2..7, vLLM issue #20780 (EAGLE-3, Llama-3.1-8B-Instruct, MT-bench, H100).
EAGLE3_LLAMA31_8B_MTBENCH_AL = (2.36, 2.79, 3.08, 3.32, 3.46, 3.54)


def _eagle_curve() -> tuple[float, ...]:
    """Conditional per-position rates from the published AL(K) series (see the module docstring)."""
    al = EAGLE3_LLAMA31_8B_MTBENCH_AL
    reach = [al[i] - al[i - 1] for i in range(1, len(al))]        # P(first K accepted), K = 3..7
    both = al[0] - 1                                              # P(>=1) + P(>=2)
    # P(>=2) = x with x / (both - x) = reach[0] / x:  x^2 + reach[0] x - reach[0] both = 0
    x = (-reach[0] + (reach[0] ** 2 + 4 * reach[0] * both) ** 0.5) / 2
    unconditional = [both - x, x, *reach]
    rates = [unconditional[0]] + [unconditional[i] / unconditional[i - 1] for i in range(1, len(unconditional))]
    return tuple(round(r, 3) for r in rates)


EAGLE_LLAMA31_8B_MTBENCH = _eagle_curve()     # (0.781, 0.742, 0.742, 0.674, 0.828, 0.583, 0.571)
MTP_DEEPSEEK_V3 = (0.875,)
DEFAULT_CURVES = {
    "eagle": (EAGLE_LLAMA31_8B_MTBENCH, "EAGLE-3 on Llama-3.1-8B-Instruct, MT-bench, vLLM V1 (vLLM issue #20780)"),
    "mtp": (MTP_DEEPSEEK_V3, "DeepSeek-V3 MTP, second-token acceptance 85-90% (arXiv:2412.19437)"),
}


@dataclass(frozen=True)
class Speculation:
    """A deployment's speculative decoding as the simulator models it."""

    method: str
    k: int
    acceptance: tuple[float, ...]     # conditional rate per draft position, len == k
    source: str                        # where the curve comes from
    drafting: tuple[float, ...] | None = None   # conditional drafting rate per position (None: always k)
    persistence: float | None = None   # P(a lookup drafts | the sequence's last one drafted); None: drafting[0]
    draft_model: str | None = None     # method "draft": the catalog model that drafts (priced by the cost models)

    def expected_accepted(self, drafts: int | None = None) -> float:
        """Expected accepted drafts per verify step of `drafts` (default k) drafts."""
        return _expected_reach(self.acceptance[:self.k if drafts is None else drafts])

    def expected_acceptance_length(self) -> float:
        """1 + expected accepted drafts: tokens a full verify step yields per sequence (vLLM's
        mean acceptance length)."""
        return 1 + self.expected_accepted()

    def draw_draft_length(self, rand, after_draft: bool = False) -> int:
        """How many tokens the proposer drafts at one lookup: k, or by the drafting curve (the first
        position it does not reach ends the draft); right after a lookup that drafted (`after_draft`),
        the first position's rate is the persistence. One uniform from `rand` per draw."""
        if self.drafting is None:
            return self.k
        if after_draft and self.persistence is not None:
            return _run_length(rand(), (self.persistence, *self.drafting[1:]), self.k)
        return _run_length(rand(), self.drafting, self.k)

    def draw(self, rand, drafts: int) -> int:
        """How many of `drafts` drafts the target accepts (the first rejection ends them); one uniform
        from `rand` per draw."""
        return _run_length(rand(), self.acceptance, drafts)

    def as_dict(self) -> dict:
        return {"method": self.method, "num_speculative_tokens": self.k, "acceptance": list(self.acceptance),
                "acceptance_source": self.source,
                "expected_mean_acceptance_length": self.expected_acceptance_length(),
                **({} if self.drafting is None else {"draft_rates": list(self.drafting),
                                                     "draft_persistence": self.persistence})}


def _expected_reach(rates) -> float:
    """Expected run length of successes under per-position conditional rates: sum of their running products."""
    total, reach = 0.0, 1.0
    for p in rates:
        reach *= p
        total += reach
    return total


def _run_length(u: float, rates, most: int) -> int:
    """The run of successes, at most `most`, that the uniform `u` gives under per-position conditional
    rates, by inversion: P(run >= i) is the product of the first i rates, and the run is the number of
    those products above `u`. The same law as drawing position by position until the first failure,
    with one uniform per run, so that a stratified stream of uniforms stratifies the runs."""
    n, reach = 0, 1.0
    while n < most:
        reach *= rates[n]
        if u >= reach:
            break
        n += 1
    return n


def speculation_of(deployment: Deployment) -> Speculation | None:
    """The deployment's speculation (None: off); a PlannerError in one line for what cannot be modelled."""
    if deployment.speculative is None:
        return None
    method, k = parse_speculative(deployment.speculative)
    if method == "draft":
        _check_draft_model(deployment)
    if deployment.allocator != "paged":
        raise PlannerError(f"--speculative needs the paged allocator, not {deployment.allocator}")
    if deployment.acceptance is not None:
        curve, source = parse_acceptance(deployment.acceptance), "given (--acceptance)"
    elif method in DEFAULT_CURVES:
        curve, source = DEFAULT_CURVES[method]
    else:
        raise PlannerError(f"--speculative {method}:{k}: give --acceptance P1,P2,... (n-gram acceptance depends "
                           f"on the workload: per-position rates, e.g. measured by the engine's proposer)")
    if len(curve) < k:
        raise PlannerError(f"--speculative {method}:{k}: the acceptance curve has {len(curve)} position"
                           f"{'s' if len(curve) != 1 else ''} ({source}); give --acceptance with {k} rates")
    drafting = None
    if deployment.draft_rates is not None:
        drafting = parse_acceptance(deployment.draft_rates, "--draft-rates")
        if len(drafting) < k:
            raise PlannerError(f"--draft-rates has {len(drafting)} position{'s' if len(drafting) != 1 else ''}: "
                               f"give {k} rates for --speculative {method}:{k}")
        drafting = drafting[:k]
    elif deployment.draft_persistence is not None:
        raise PlannerError("--draft-persistence needs --draft-rates (the rate of a first draft)")
    return Speculation(method, k, tuple(curve[:k]), source, drafting, deployment.draft_persistence,
                       deployment.draft_model)


def _check_draft_model(deployment: Deployment) -> None:
    """A draft model the simulator can price: a catalog model (or model folder) of the target's vocabulary."""
    if deployment.draft_model is None:
        raise PlannerError("--speculative draft:K: give the draft model (--draft-model, a catalog model)")
    if deployment.acceptance is None:
        raise PlannerError("--speculative draft:K: give --acceptance P1,P2,... (a draft model's acceptance "
                           "depends on the pair and the workload; validate measures it live)")
    draft, target = catalog_model(deployment.draft_model), catalog_model(deployment.model)
    if draft.vocab_size != target.vocab_size:
        raise PlannerError(f"--draft-model {deployment.draft_model}: vocabulary of {draft.vocab_size} tokens, "
                           f"{target.name}'s has {target.vocab_size}; a draft model shares the target's tokenizer")


def proposer_model(deployment: Deployment, target: ModelSpec) -> tuple[ModelSpec, bool] | None:
    """The network that drafts for `deployment` and whether it shares the target's embedding and LM head
    (an EAGLE or MTP head does; a draft model has its own); None without one (off, ngram)."""
    method = parse_speculative(deployment.speculative)[0] if deployment.speculative else None
    if method == "draft" and deployment.draft_model is not None:
        return catalog_model(deployment.draft_model), False
    if method not in ("eagle", "mtp"):
        return None
    if method == "mtp" and target.compressed_attention is not None:
        raise PlannerError(f"--speculative mtp on {target.name}: its MTP layer's attention (which of DeepSeek-V4's "
                           f"compressed kinds, config.json's last compress_ratios entry) is not modelled; give "
                           f"eagle or ngram")
    # an MTP head is one of the target's MoE layers (DeepSeek's: latent attention, routed and shared experts)
    head = dict(name=f"{target.name} {method} head", num_layers=1, hf_id=None, aliases=(),
                published_params=None, published_active_params=None, sliding_window=None, sliding_layers=0,
                dense_layers=0, linear_attention=None,     # Qwen3.5's MTP layer attends
                # Nemotron 3's: an attention block and a MoE block (its mtp_hybrid_override_pattern "*E")
                ffn_layers=1 if target.block_pattern else 0,
                block_pattern=("*E" if target.is_moe else "*-") if target.block_pattern else "",
                mlp_widths=())           # (a DeciLM's head: one MLP of its widest)
    if method == "eagle":                  # a Llama decoder layer, whatever the target
        head_size = target.head_size if not target.is_mla else target.hidden_size // target.num_heads
        head |= dict(model_type="llama", num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0,
                     shared_experts=0, kv_lora_rank=0, q_lora_rank=0, qk_rope_head_dim=0, v_head_dim=0,
                     head_size=head_size, attention_sinks=False, checkpoint_quantization=None, ffn_layers=0,
                     block_pattern="", moe_latent_size=0, global_attention=None, compressed_attention=None,
                     sparse_indexer=None, partial_rotary_dims=0)
    head = replace(target, **head)
    return head, True
