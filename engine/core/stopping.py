"""When a sequence stops: a stop token, or its length limit."""
from __future__ import annotations

from engine.core.sequence import FinishReason, SequenceGroup


def is_stop_token(group: SequenceGroup, token: int) -> bool:
    """An EOS id of the model (any of them, unless the request ignores EOS) or
    one of the request's stop tokens."""
    params = group.params
    return (token in group.eos_token_ids and not params.ignore_eos) or token in params._stop_set


def stop_reason(group: SequenceGroup, token: int, seq_len: int, num_output: int,
                max_model_len: int) -> FinishReason | None:
    """Why a sequence that just produced ``token`` (now ``seq_len`` tokens long,
    ``num_output`` of them generated) ends, or None if it goes on."""
    if is_stop_token(group, token):
        return FinishReason.STOP
    if num_output >= group.params.max_tokens or seq_len >= max_model_len:
        return FinishReason.LENGTH
    return None
