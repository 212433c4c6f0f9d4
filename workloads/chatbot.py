"""The chatbot workload: multi-turn conversations with a growing history.

Paper Sec. 6.5 / Fig. 17: conversations from ShareGPT; each turn's prompt is
the whole history so far (every earlier message and answer plus the new
message) truncated to its last 1024 tokens, and outputs go up to 1024 tokens.

Our stand-in (the paper gives no per-conversation statistics, so the turn
count, think time and answer speed below are assumptions, all parameters):
- turns per conversation: geometric with mean ``mean_turns`` (default 4),
  capped at ``max_turns`` (32);
- each turn's new user message and the model's answer are a ShareGPT-like
  (prompt, output) pair (generators.sharegpt_pairs), the answer capped at
  ``max_output_len`` as a max_tokens limit would cap it;
- arrivals: conversations start by the chosen arrival process at
  ``rate / mean_turns`` per second, so the long-run request rate is about
  ``rate``.  A trace is static, so a later turn cannot wait for the real
  answer; it arrives at the previous turn's arrival + an estimated answer
  time (output_len * ``time_per_token``, default 0.05 s, a decode speed of 20
  tokens/s) + a think time, exponential with mean ``think_time`` (10 s).
  The turn keeps its think time (``think_time``), so a run with
  ``--turns-after-answers`` sends it that long after the real answer instead
  (workloads/sessions.py).
- ``prefix_len`` of a turn is its previous prompt + answer (what a prefix
  cache could reuse), or 0 when truncation slid the window.

Bounds: conversations are added in start order until there are
``num_requests`` requests (the last conversation may be cut short); with a
duration, conversations that start before it are kept, and so are their
turns that arrive before it.
"""

from __future__ import annotations

import math

import numpy as np

from .arrivals import TIME_DECIMALS, arrival_times, check_arrival_args
from .errors import TraceError
from .generators import sharegpt_pairs
from .schema import TraceRequest
from .tokens import stream


def make_chatbot(
    *,
    num_requests: int | None,
    duration: float | None,
    rate: float,
    arrival: str,
    cv: float,
    seed: int,
    mean_turns: float = 4.0,
    max_turns: int = 32,
    max_history: int = 1024,
    max_output_len: int = 1024,
    think_time: float = 10.0,
    time_per_token: float = 0.05,
) -> list[TraceRequest]:
    """The chatbot trace's requests, conversation after conversation (see the module docstring)."""
    _check_chatbot_args(mean_turns, max_turns, max_history, max_output_len, think_time, time_per_token)
    check_arrival_args(arrival, rate, cv, num_requests, duration)
    # every conversation has at least one turn, so num_requests starts suffice
    starts = arrival_times(
        stream(seed, "arrivals"), arrival=arrival, rate=rate / mean_turns, cv=cv,
        num_requests=num_requests, duration=duration,
    )
    # one child stream per quantity: conversation c is the same whatever the count
    turn_rng, pair_rng, think_rng = stream(seed, "lengths", "chatbot").spawn(3)
    turns = np.minimum(turn_rng.geometric(1.0 / mean_turns, len(starts)), max_turns)
    total = int(turns.sum())
    messages, answers = sharegpt_pairs(pair_rng, total)
    answers = np.minimum(answers, max_output_len)
    thinks = think_rng.exponential(think_time, total)

    requests: list[TraceRequest] = []
    k = 0  # index into the per-turn draws
    limit = num_requests if num_requests is not None else math.inf
    for c, (start, n_turns) in enumerate(zip(starts, turns)):
        if len(requests) >= limit:
            break
        n = int(n_turns)
        requests += _conversation(c, float(start), messages[k:k + n], answers[k:k + n], thinks[k:k + n],
                                  max_history, time_per_token, duration, limit - len(requests))
        k += n
    return requests


def _check_chatbot_args(mean_turns: float, max_turns: int, max_history: int, max_output_len: int,
                        think_time: float, time_per_token: float) -> None:
    if not (mean_turns >= 1 and max_turns >= 1 and max_history >= 8 and max_output_len >= 1):
        raise TraceError("mean_turns/max_turns/max_history/max_output_len: need mean_turns >= 1, max_turns >= 1, max_history >= 8, max_output_len >= 1")
    if not (think_time >= 0 and time_per_token >= 0 and math.isfinite(think_time + time_per_token)):
        raise TraceError(f"think_time/time_per_token: must be finite and >= 0, got {think_time}, {time_per_token}")


def _conversation(c: int, start: float, messages, answers, thinks, max_history: int, time_per_token: float,
                  duration: float | None, room: float) -> list[TraceRequest]:
    """The requests of conversation ``c``, one a turn, from its per-turn draws: each
    prompt is the history so far truncated to its last ``max_history`` tokens; the
    next turn arrives after the estimated answer time and a think time. Only turns
    that arrive before ``duration`` are kept, ``room`` of them at most."""
    requests: list[TraceRequest] = []
    history = 0  # untruncated tokens so far
    t_arrive = start
    think_before = None   # the user's think time after the previous turn's answer
    for t in range(len(messages)):
        message, answer, think = int(messages[t]), int(answers[t]), float(thinks[t])
        before = history
        history += message
        truncated = history > max_history
        if (duration is None or t_arrive < duration) and len(requests) < room:
            requests.append(
                TraceRequest(
                    request_id=f"chatbot-{c}-{t}",
                    arrival_time=round(t_arrive, TIME_DECIMALS),
                    prompt_len=min(history, max_history),
                    output_len=answer,
                    conversation_id=f"conv-{c}",
                    turn=t,
                    think_time=think_before,
                    prefix_len=before if (t > 0 and not truncated) else 0,
                )
            )
        history += answer
        t_arrive += answer * time_per_token + think
        think_before = round(think, TIME_DECIMALS)
    return requests
