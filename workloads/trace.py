"""A trace: requests sorted by arrival, with the name and parameters that made it."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Iterator, Mapping

import numpy as np

from . import trace_files
from .arrivals import RampUp, arrival_times
from .errors import TraceError
from .schema import TraceRequest
from .tokens import Streams, hash_block, random_ids, stream

MAX_LENGTH_SCALE = 1e4     # a --length-scale beyond it is a typo (every length 10,000 times over)


# The columns of a production trace (Azure's LLM inference traces) that
# ``Trace.load`` recognizes in a CSV header.
PRODUCTION_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def is_production_csv(header: list[str]) -> bool:
    """A production header: some of its columns and none of ours (the importer then names what is missing)."""
    return any(c in header for c in PRODUCTION_COLUMNS) and not any(c in header for c in trace_files.REQUIRED)


def not_a_file(path: Path) -> str:
    """Why `path` is no file to read: a folder, a link that leads nowhere, or nothing there."""
    if path.is_dir():
        return "a folder, not a file"
    if path.is_symlink():
        return "a symbolic link to no file"
    return "no such file"


class Trace:
    """Requests sorted by arrival time (stable, so ties keep their given order)."""

    def __init__(self, requests: list[TraceRequest], name: str = "trace", params: dict | None = None):
        self.requests: list[TraceRequest] = sorted(requests, key=lambda r: r.arrival_time)
        self.name = name
        self.params = dict(params or {})
        ids = [r.request_id for r in self.requests]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise TraceError(f"request_id: duplicate id {dup!r} in trace {name!r}")
        self._turns: dict[tuple[str, int], TraceRequest] | None = None
        self._streams: Streams | None = None   # the requests' prompt streams, for one seed

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[TraceRequest]:
        return iter(self.requests)

    def __getitem__(self, i: int) -> TraceRequest:
        return self.requests[i]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Trace) and self.requests == other.requests

    def __repr__(self) -> str:
        return f"Trace({self.name!r}, {len(self)} requests)"

    # --- files -----------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        """Read a .jsonl (or .json lines) or .csv trace written by ``save`` or by hand.

        A .csv whose header has TIMESTAMP, ContextTokens and GeneratedTokens is
        a production trace (Azure's format) and is imported as such, and so is a
        .jsonl of Mooncake's (input_length, output_length, hash_ids: workloads/mooncake.py).
        """
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix not in (".jsonl", ".json", ".csv"):
            raise TraceError(f"{path}: unknown trace format {suffix!r} (expected .jsonl or .csv)")
        if not path.is_file():
            raise TraceError(f"{path}: {not_a_file(path)}")
        if suffix == ".csv":
            if is_production_csv(trace_files.read_csv_header(path)):
                from .importers import import_csv_trace   # imports this module: import late

                return import_csv_trace(path)
            return cls(trace_files.parse_csv(path), name=path.stem)
        if trace_files.is_mooncake(trace_files.first_object(path)):
            from .mooncake import import_mooncake     # imports this module: import late

            return import_mooncake(path)
        requests, name, params = trace_files.parse_jsonl(path)
        return cls(requests, name=name or path.stem, params=params)

    def save(self, path: str | Path) -> Path:
        """Write as JSONL or CSV by extension (CSV keeps the requests, not the metadata)."""
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix in (".jsonl", ".json"):
            text = trace_files.dump_jsonl(self.requests, self.name, self.params)
        elif suffix == ".csv":
            text = trace_files.dump_csv(self.requests)
        else:
            raise TraceError(f"{path}: unknown trace format {suffix!r} (expected .jsonl or .csv)")
        capped = next(((r, cap) for r in self.requests if (cap := trace_files.over_cap(r))), None)
        if capped is not None:             # (an imported dataset's, say: a file no run would read back)
            (req, (field, why)) = capped
            raise TraceError(f"{path}: not written: request {req.request_id}'s {field} {why}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "w", encoding="utf-8", newline="") as fh:
                fh.write(text)
        except OSError as exc:
            raise TraceError(f"{path}: cannot be written ({exc.strerror or exc})") from None
        return path

    # --- statistics --------------------------------------------------------------

    def stats(self) -> dict:
        """Count, duration, arrival rate and mean/median/p99/max of the lengths.

        ``arrival_rate`` is (count - 1) / duration: a trace starts with an
        arrival, so count - 1 gaps span the duration (inf when all arrive at once).
        """
        out: dict = {"name": self.name, "count": len(self)}
        if not self.requests:
            return out | {"duration": 0.0, "arrival_rate": math.inf}
        times = np.array([r.arrival_time for r in self.requests])
        duration = float(times[-1] - times[0])
        out["duration"] = duration
        out["arrival_rate"] = (len(self) - 1) / duration if duration > 0 else math.inf
        for key in ("prompt_len", "output_len"):
            values = np.array([getattr(r, key) for r in self.requests], dtype=float)
            out[f"{key}_mean"] = float(values.mean())
            out[f"{key}_median"] = float(np.median(values))
            out[f"{key}_p99"] = float(np.percentile(values, 99))
            out[f"{key}_max"] = int(values.max())
        out["total_prompt_tokens"] = int(sum(r.prompt_len for r in self.requests))
        out["total_output_tokens"] = int(sum(r.output_len for r in self.requests))
        out["num_prefixes"] = len({r.prefix_id for r in self.requests if r.prefix_id is not None})
        turns = [r for r in self.requests if r.conversation_id is not None]
        out["num_conversations"] = len({r.conversation_id for r in turns})
        if turns:                            # how long the conversations run
            out["turns_mean"] = len(turns) / out["num_conversations"]
        # the prompt tokens a shared prefix or a conversation's history holds: what a prefix cache could reuse
        shared = sum(r.prefix_len for r in self.requests) + self.hashed_reuse()
        out["prefix_token_share"] = shared / out["total_prompt_tokens"]
        salts = {r.cache_salt for r in self.requests if r.cache_salt is not None}
        if salts:                            # vLLM's cache_salt: the tenants whose cached blocks are kept apart
            out["num_cache_salts"] = len(salts)
        priorities = Counter(r.priority for r in self.requests)
        if len(priorities) > 1:              # vLLM's request priorities: each one's share of the requests
            out |= {f"priority_{p}_share": priorities[p] / len(self) for p in sorted(priorities)}
        return out

    def hashed_reuse(self, kv_block_size: int = 1) -> int:
        """The prompt tokens of block-hash prompts that lie in blocks an earlier request held, block by block
        from the start (what an unbounded prefix cache would reuse); of those, with `kv_block_size`, only the
        whole KV blocks of that many tokens (what a paged prefix cache can hold)."""
        seen: set[int] = set()
        reused = 0
        for req in self.requests:
            if req.hash_ids is None:
                continue
            size = req.hash_block_size
            lead = next((i for i, h in enumerate(req.hash_ids) if h not in seen), len(req.hash_ids))
            tokens = min(req.prompt_len, lead * size)
            reused += tokens - tokens % kv_block_size
            seen.update(req.hash_ids)
        return reused

    # --- derived traces -------------------------------------------------------------

    def head(self, num_requests: int | None = None, duration: float | None = None) -> "Trace":
        """The first num_requests requests and/or those arriving before first + duration."""
        reqs = self.requests
        if duration is not None and reqs:
            start = reqs[0].arrival_time
            reqs = [r for r in reqs if r.arrival_time - start < duration]
        if num_requests is not None:
            reqs = reqs[:num_requests]
        return Trace(reqs, self.name, self.params)

    def retimed(self, *, arrival: str = "poisson", rate: float = math.inf, cv: float = 1.0, seed: int = 0,
                ramp_up: RampUp | None = None) -> "Trace":
        """The same requests, in the same order, with new arrival times (at `rate`, or by `ramp_up`).

        Chatbot turns keep their order but lose the answer + think-time spacing (their `think_time`, which
        --turns-after-answers waits after each answer, stays).
        """
        times = arrival_times(stream(seed, "arrivals"), arrival=arrival, rate=rate, cv=cv, num_requests=len(self),
                              ramp_up=ramp_up)
        reqs = [r.model_copy(update={"arrival_time": float(t)}) for r, t in zip(self.requests, times)]
        params = (self.params | {"arrival": arrival, "rate": rate, "cv": cv, "arrival_seed": seed}
                  | (ramp_up.record() if ramp_up else {}))
        return Trace(reqs, self.name, params)

    def scaled(
        self,
        *,
        length_scale: float = 1.0,
        max_prompt_len: int | None = None,
        max_output_len: int | None = None,
    ) -> "Trace":
        """Shrink lengths for a small-model or CPU validation run.

        Each length becomes max(1, round(len * length_scale)), then is capped.
        Structure survives: a prefix stays a prefix (and at most the prompt), block hashes keep their blocks
        (each block scaled, as many kept as cover the scaled prompt), and
        a chatbot turn that extended its predecessor still does (its prompt is
        rebuilt as the scaled previous prompt + answer + the scaled new message;
        if that passes max_prompt_len it is truncated and shares nothing, as a
        truncated turn in the original does).  Stored token ids are cut to the
        new prompt length (a prompt cannot grow past the ids it has).
        """
        if not 0 < length_scale <= MAX_LENGTH_SCALE:
            raise TraceError(f"length_scale: must be a number > 0 and at most {MAX_LENGTH_SCALE:g}, got {length_scale}")
        for label, cap in (("max_prompt_len", max_prompt_len), ("max_output_len", max_output_len)):
            if cap is not None and cap < 1:
                raise TraceError(f"{label}: must be >= 1, got {cap}")
        max_p = max_prompt_len or math.inf
        max_o = max_output_len or math.inf

        def scale(n: int) -> int:
            return max(1, round(n * length_scale))

        new_len: dict[str, tuple[int, int]] = {}  # request_id -> scaled (prompt, output)
        out = []
        for req in self.requests:
            output = int(min(max_o, scale(req.output_len)))
            prev = self._previous_turn(req)
            if prev is not None and req.prefix_len > 0 and prev.request_id in new_len:
                history = sum(new_len[prev.request_id])
                prompt = history + scale(req.prompt_len - req.prefix_len)
                prefix = history
                if prompt > max_p:
                    prompt, prefix = int(max_p), 0
            else:
                prompt = int(min(max_p, scale(req.prompt_len)))
                prefix = min(prompt, scale(req.prefix_len)) if req.prefix_len else 0
            ids = req.prompt_token_ids
            if ids is not None:
                prompt = min(prompt, len(ids))
                prefix = min(prefix, prompt)
                ids = ids[:prompt]
            blocks, block_size = req.hash_ids, req.hash_block_size
            if blocks is not None:      # blocks scaled as the prompt is, as many as still cover it
                block_size = scale(block_size)
                prompt = min(prompt, len(blocks) * block_size)
                blocks = blocks[:-(-prompt // block_size)]
            answer = req.output_token_ids
            if answer is not None:
                output = min(output, len(answer))
                answer = answer[:output]
            new_len[req.request_id] = (prompt, output)
            out.append(
                req.model_copy(
                    update={"prompt_len": prompt, "output_len": output, "prefix_len": prefix, "prompt_token_ids": ids,
                            "output_token_ids": answer, "hash_ids": blocks, "hash_block_size": block_size}
                )
            )
        scaling = {"length_scale": length_scale, "max_prompt_len": max_prompt_len, "max_output_len": max_output_len}
        return Trace(out, self.name, self.params | {"scaled": scaling})

    # --- token ids ------------------------------------------------------------------

    def _previous_turn(self, req: TraceRequest) -> TraceRequest | None:
        if req.conversation_id is None or req.turn == 0:
            return None
        if self._turns is None:
            self._turns = {(r.conversation_id, r.turn): r for r in self.requests if r.conversation_id is not None}
        return self._turns.get((req.conversation_id, req.turn - 1))

    def output_token_ids(self, request: TraceRequest, vocab_size: int, seed: int = 0) -> list[int]:
        """The answer a trace-driven run emits for ``request`` (output_len ids): the trace's own when it
        has them (an imported real answer), else deterministic random ids."""
        if request.output_token_ids is not None:
            return list(request.output_token_ids)
        return random_ids(vocab_size, request.output_len, seed, "answer", request.request_id).tolist()

    def prompt_token_ids(self, request: TraceRequest, vocab_size: int, seed: int = 0,
                         answers: Mapping[str, list[int]] | None = None) -> list[int]:
        """Deterministic prompt ids (prompt_len of them) for ``request``.

        - Ids stored in the trace (imported real prompts) are returned as they are, but for a conversation's
          turn whose ``prefix_len`` is its previous turn's prompt + answer (an imported conversation): that
          history as its previous turn was sent and answered (below; and as scaled), then its own ids.
        - A chatbot turn whose previous turn is in this trace continues it: if
          ``prefix_len`` equals the previous prompt + answer, the prompt is those
          ids followed by fresh ids for the new message (so prefix caching can
          reuse the whole history); otherwise the history was truncated and the
          prompt is the last prompt_len ids of previous prompt + answer + a new
          message just long enough to make the window slide (the trace does not
          keep the message's length; any length gives a window that starts at a
          different token, which is all a cache can see).
        - A prompt of block hashes (an imported Mooncake trace) is its blocks' ids, each block's drawn from
          its hash id's stream (the same in every request that holds the block), the last block cut.
        - Otherwise the first ``prefix_len`` ids come from the ``prefix_id``
          stream (the same in every request of that prefix) and the rest from
          the request's own stream.

        ``answers`` (request id -> ids) holds the answers a live model gave to earlier turns: a turn's
        history then holds those, as a multi-turn client sends back the answer it got, instead of the
        trace's (the same length, so the same lengths and blocks, and the same prefix-cache hits).
        """
        return self._prompt_ids(request, vocab_size, seed, answers or {}).tolist()

    def _prompt_streams(self, seed: int) -> Streams:
        """The requests' own prompt streams (random_ids' "prompt" ones), seeded many at a time."""
        if self._streams is None or self._streams.seed != seed:
            self._streams = Streams(seed, [("prompt", r.request_id) for r in self.requests])
        return self._streams

    def _prompt_ids(self, req: TraceRequest, vocab_size: int, seed: int,
                    answers: Mapping[str, list[int]]) -> np.ndarray:
        prev = self._previous_turn(req)
        if req.prompt_token_ids is not None:
            stored = np.asarray(req.prompt_token_ids, dtype=np.int64)
            if prev is None or not req.prefix_len:
                return stored
            history = self._history(prev, vocab_size, seed, answers)
            # an imported turn that holds its predecessor's prompt and answer whole: the history as sent (a
            # live answer in place of the trace's; scaled lengths), then the turn's own message
            return np.concatenate([history, stored[len(history):]]) if req.prefix_len == len(history) < len(stored) \
                else stored
        if req.hash_ids is not None:
            blocks = [hash_block(vocab_size, req.hash_block_size, seed, h) for h in req.hash_ids]
            return np.concatenate(blocks)[:req.prompt_len]
        own = self._prompt_streams(seed).random_ids(vocab_size, req.prompt_len, "prompt", req.request_id)
        if prev is not None:
            history = self._history(prev, vocab_size, seed, answers)
            if req.prefix_len == len(history) and req.prompt_len > len(history):
                return np.concatenate([history, own[: req.prompt_len - len(history)]])
            message = own[: max(1, req.prompt_len - len(history) + 1)]
            return np.concatenate([history, message])[-req.prompt_len :]
        if req.prefix_len and req.prefix_id is not None:
            shared = random_ids(vocab_size, req.prefix_len, seed, "prefix", req.prefix_id)
            return np.concatenate([shared, own[: req.prompt_len - req.prefix_len]])
        return own

    def _history(self, prev: TraceRequest, vocab_size: int, seed: int,
                 answers: Mapping[str, list[int]]) -> np.ndarray:
        """A conversation's history after turn `prev`: its prompt, then the answer it got (the live one if
        `answers` holds it, else the trace's)."""
        return np.concatenate([self._prompt_ids(prev, vocab_size, seed, answers),
                               answers.get(prev.request_id) or self.output_token_ids(prev, vocab_size, seed)])
