"""vLLM's dual-batch overlap (--enable-dbo): a step run as two microbatches, one's all-to-all under the other's compute.

What vLLM does. With --enable-dbo (vllm/config/parallel.py ParallelConfig; VllmConfig refuses it unless the
all2all backend is one of DeepEP's) the GPU model runner splits a step's tokens at the middle of its padded
count (vllm/v1/worker/ubatch_utils.py maybe_create_ubatch_slices: split_point = num_tokens_padded // 2, a
request may straddle it) and two threads run the model on the halves (gpu_ubatch_wrapper.py UBatchWrapper),
handing the GPU to each other around every MoE layer's dispatch and combine, so that one microbatch's
all-to-all runs on the communication stream while the other computes (vLLM's docs/design/dbo.md). A step is
split when it schedules at least `dbo_decode_token_threshold` tokens (default 32) and is a uniform decode, or
at least `dbo_prefill_token_threshold` (default 512) otherwise (check_ubatch_thresholds), and holds at least
two requests. The logits and the sampler run once, on the joined output, outside the wrapper.

The price. Each half's token terms (GEMMs, experts, norms, all-reduces, its own dispatch) at its own token
count, so what a half reads whatever its size (the weights, at decode) is paid twice; that is why vLLM splits
only large steps. Attention, whose work divides with its sequences, is priced whole. With C the compute and M
the all-to-all of both halves over the step's L MoE layers, a layer runs each microbatch's compute c = C / 2L
on the compute stream and its all-to-all m = M / 2L on the other, each waiting on the other's: 2 max(c, m)
a layer, plus the step's first compute and last combine, which nothing overlaps. The step's layers take

    2L max(c, m) + min(c, m) = max(C, M) + min(C, M) / 2L

The SMs: vLLM gives the communication kernels COMM_SMS of the GPU's while they run (VLLM_DBO_COMM_SMS) and
caps DeepGEMM, the only kernel it caps, at the rest, so a split step's DeepGEMM experts run at that share of
their FLOP rate (planner/cost/deepgemm.py); the other kernels share the SMs uncapped and are priced as alone.

The dp ranks' vote. Every MoE layer's all-to-all joins all the dp ranks, so they split together or not at all:
each rank says whether its own step would split, an idle rank's dummy batch (one token) says no, and they split
only if all say yes and the rank with the fewest tokens still reaches past the middle of the largest padded
count, so that no rank's second microbatch is all padding (vllm/v1/worker/dp_utils.py `_post_process_ubatch`,
ubatch_utils.py `is_last_ubatch_empty`). A cost model prices each rank's step as that rank alone would run it;
the ranks of a lockstep group take the vote (`agreed`) and, where it fails, the steps that would have split are
priced whole (planner/sim/lockstep.py).

Left out, and said so: the dense layers' compute pooled with the MoE layers' (it has no all-to-all to hide: 3
of DeepSeek-V3's 61 layers), and the padding of a split step's ranks to the largest rank's tokens (a rank is
priced at its own; the group's step is the longest rank's, which the largest rank's token terms lead).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

# vLLM's defaults (ParallelConfig.dbo_decode_token_threshold, dbo_prefill_token_threshold)
DECODE_THRESHOLD = 32
PREFILL_THRESHOLD = 512
COMM_SMS = 20                     # SMs vLLM gives the communication kernels while they run (VLLM_DBO_COMM_SMS)
TERM = "dual-batch overlap"       # the ledger's term for the time the overlap saves (negative seconds)


@dataclass(frozen=True, slots=True)
class DualBatch:
    """When vLLM splits a step into two microbatches, and what the overlap leaves of their times."""

    decode_threshold: int = DECODE_THRESHOLD
    prefill_threshold: int = PREFILL_THRESHOLD

    def splits(self, tokens: int, seqs: int, decode_only: bool) -> bool:
        """Whether a step of `tokens` scheduled tokens over `seqs` requests runs as two microbatches."""
        return seqs >= 2 and tokens >= (self.decode_threshold if decode_only else self.prefill_threshold)

    def agreed(self, ranks: list[tuple[int, int, bool, int]], idle: bool) -> bool:
        """The dp ranks' vote on one step: each busy rank's (tokens, sequences, decode only, padded tokens);
        `idle` when some rank runs a dummy batch instead (its one token votes no)."""
        if idle or not all(self.splits(tokens, seqs, decode) for tokens, seqs, decode, _ in ranks):
            return False
        return min(r[0] for r in ranks) > max(r[3] for r in ranks) // 2

    @staticmethod
    def halves(padded: int) -> tuple[int, int]:
        """The two microbatches' tokens: the padded count split at its middle."""
        return padded // 2, padded - padded // 2

    @staticmethod
    def overlapped(compute: float, comm: float, layers: int) -> float:
        """The step's layers when both microbatches' compute (`compute`) and all-to-all (`comm`) over `layers`
        MoE layers overlap: max + min / 2L."""
        high = compute if compute >= comm else comm
        low = comm if compute >= comm else compute
        return high + low / (2 * layers)

    def describe(self) -> str:
        return (f"dual-batch overlap from {self.decode_threshold} decode / {self.prefill_threshold} other tokens "
                f"(planner/cost/dbo.py)")


class SplitsSteps:
    """What a cost model that prices dual-batch overlap (`_dbo`: its DualBatch, or None) offers the dp ranks'
    vote (planner/sim/lockstep.py)."""

    _dbo: DualBatch | None

    @property
    def dual_batch(self) -> DualBatch | None:
        return self._dbo

    def split_padding(self, tokens: int) -> int:
        """The token count a split step of `tokens` halves (CUDA-graph padding, where the model prices it)."""
        return tokens

    def whole(self):
        """This model pricing every step in one batch: what a step costs when the vote keeps it whole. It shares
        this model's caches; the ones it reads hold no split step's terms."""
        whole = copy.copy(self)
        whole._dbo = None
        return whole
