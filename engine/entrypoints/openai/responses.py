"""OpenAI response bodies: a whole completion, or its SSE stream, from AsyncEngine's updates.

A request the engine refuses before its first token gets an error status (400,
or 500 for an internal failure, 503 when the engine is not serving); one that
fails mid-stream gets an error event with the status in ``code``, then
``[DONE]``, so no client waits on a stream that will not end.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid

from fastapi.responses import Response, StreamingResponse

from engine.entrypoints.openai.async_engine import Update
from engine.entrypoints.openai.errors import ERROR_TYPES, RequestError, error_body


def logprobs_block(deltas_logprobs, token_ids, chat: bool, want_top: int):
    """OpenAI's logprobs shape for completions ({tokens, token_logprobs, top_logprobs}) or chat ({content})."""
    if deltas_logprobs is None:
        return None
    if chat:
        content = []
        for tok, pos in zip(token_ids, deltas_logprobs):
            chosen = pos[tok]
            content.append({"token": chosen.decoded_token or "", "logprob": chosen.logprob,
                            "bytes": list((chosen.decoded_token or "").encode()),
                            "top_logprobs": [{"token": lp.decoded_token or "", "logprob": lp.logprob,
                                              "bytes": list((lp.decoded_token or "").encode())}
                                             for _, lp in sorted(pos.items(), key=lambda kv: kv[1].rank or 0)
                                             if lp.rank is not None and lp.rank <= want_top]})
        return {"content": content}
    tokens, token_lps, tops = [], [], []
    for tok, pos in zip(token_ids, deltas_logprobs):
        chosen = pos[tok]
        tokens.append(chosen.decoded_token or "")
        token_lps.append(chosen.logprob)
        tops.append({(lp.decoded_token or str(t)): lp.logprob for t, lp in pos.items()
                     if lp.rank is not None and lp.rank <= max(want_top, 0)} if want_top else None)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": []}


def refusal(update: Update) -> RequestError:
    return RequestError(update.error, status=update.status)


async def serve_request(state, body, prefix: str, prompt_text, token_ids, params, arrival: float, *, chat: bool,
                        lora=None):
    """Submit the request and answer it: one JSON body, or an SSE stream once the engine accepted it.
    `lora`: the LoRARequest it runs with (None: the base model), whose name the answer gives as its model."""
    request_id = f"{prefix}-{uuid.uuid4().hex}"
    model_name = state.models.name_of(lora)
    details = state.options.enable_prompt_tokens_details
    prompt = {"prompt_token_ids": token_ids, "prompt": prompt_text}
    if body.cache_salt is not None:
        prompt["cache_salt"] = body.cache_salt
    updates = state.async_engine.generate(request_id, prompt, params, arrival, stream=body.stream,
                                          priority=body.priority, lora_request=lora)
    if not body.stream:
        final = None
        async for update in updates:
            if update.error is not None:
                raise refusal(update)
            final = update.final
        # n = 1,024 answers with logprobs are tens of MB of JSON: built and rendered off the event loop
        rendered = await asyncio.to_thread(lambda: json.dumps(
            _whole(model_name, request_id, final, token_ids, params, chat, details, bool(body.return_token_ids)),
            ensure_ascii=False,
            allow_nan=False, separators=(",", ":")).encode())          # as FastAPI's JSONResponse renders it
        return Response(rendered, media_type="application/json")
    # Streaming: wait for the request to be accepted or refused before the 200 goes out.
    first: Update = await updates.__anext__()
    if first.error is not None:
        await updates.aclose()
        raise refusal(first)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    stream = _Stream(model_name, request_id, chat, include_usage, params, token_ids, details,
                     bool(body.return_token_ids))
    return StreamingResponse(stream.events(first, updates), media_type="text/event-stream")


def usage(prompt_tokens: int, completion_tokens: int, final, details: bool) -> dict:
    """OpenAI's usage; with vLLM's --enable-prompt-tokens-details, the prompt tokens found cached too (as vLLM,
    only when some were)."""
    doc = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens}
    if details and final.num_cached_tokens:
        doc["prompt_tokens_details"] = {"cached_tokens": final.num_cached_tokens}
    return doc


def _whole(model_name: str, request_id: str, final, token_ids, params, chat: bool, details: bool,
           return_ids: bool = False) -> dict:
    want_top = params.logprobs or 0
    choices = []
    for o in final.outputs:
        lp = logprobs_block(o.logprobs, o.token_ids, chat, want_top)
        if chat:
            choice = {"index": o.index, "message": {"role": "assistant", "content": o.text or ""},
                      "logprobs": lp, "finish_reason": o.finish_reason, "stop_reason": o.stop_reason}
        else:
            choice = {"index": o.index, "text": o.text or "", "logprobs": lp,
                      "finish_reason": o.finish_reason, "stop_reason": o.stop_reason}
            if return_ids:
                choice["prompt_token_ids"] = list(token_ids)
        if return_ids:
            choice["token_ids"] = list(o.token_ids)
        choices.append(choice)
    completion_tokens = sum(len(o.token_ids) for o in final.outputs)
    doc = {"id": request_id, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
           "model": model_name, "choices": choices,
           "usage": usage(len(token_ids), completion_tokens, final, details)}
    if chat and return_ids:
        doc["prompt_token_ids"] = list(token_ids)
    return doc


class _Stream:
    """The SSE events of one streaming request."""

    def __init__(self, model_name: str, request_id: str, chat: bool, include_usage: bool, params,
                 prompt_ids: list[int], details: bool, return_ids: bool = False) -> None:
        self.model_name = model_name
        self.request_id = request_id
        self.chat = chat
        self.include_usage = include_usage
        self.params = params
        self.prompt_tokens = len(prompt_ids)
        self.details = details
        self.created = int(time.time())
        # vLLM's return_token_ids: the prompt's ids go with the first chunk that carries choices
        self.prompt_ids = list(prompt_ids) if return_ids else None
        self.return_ids = return_ids

    def chunk(self, choices, usage=None) -> str:
        doc = {"id": self.request_id, "object": "chat.completion.chunk" if self.chat else "text_completion",
               "created": self.created, "model": self.model_name, "choices": choices}
        if self.include_usage:
            doc["usage"] = usage
        if self.chat and self.prompt_ids is not None and choices:
            doc["prompt_token_ids"], self.prompt_ids = self.prompt_ids, None
        return f"data: {json.dumps(doc, separators=(',', ':'))}\n\n"

    def choices(self, update: Update) -> list[dict]:
        want_top = self.params.logprobs or 0
        out = []
        for d in update.seqs:
            lp = logprobs_block(d.logprobs, d.token_ids, self.chat, want_top)
            delta = {"delta": {"content": d.text}} if self.chat else {"text": d.text}
            choice = {"index": d.index, **delta, "logprobs": lp, "finish_reason": d.finish_reason,
                      "stop_reason": d.stop_reason}
            if self.return_ids:
                choice["token_ids"] = list(d.token_ids)
            out.append(choice)
        if not self.chat and self.prompt_ids is not None and out:
            for choice in out:
                choice["prompt_token_ids"] = self.prompt_ids
            self.prompt_ids = None
        return out

    async def events(self, first: Update, updates):
        completion_tokens = 0
        if self.chat:   # the role comes first, as OpenAI sends it: a chunk of its own for each choice (as vLLM)
            for i in range(self.params.n):
                yield self.chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                   "finish_reason": None}])
        update = first
        try:
            while True:
                if update.error is not None:
                    status = update.status
                    body = error_body(update.error, ERROR_TYPES.get(status, "APIError"), None, status)
                    yield f"data: {json.dumps(body)}\n\n"
                    break
                completion_tokens += sum(len(d.token_ids) for d in update.seqs)
                if update.seqs:
                    yield self.chunk(self.choices(update))
                if update.final is not None:
                    if self.include_usage:
                        yield self.chunk([], usage(self.prompt_tokens, completion_tokens, update.final,
                                                   self.details))
                    break
                update = await updates.__anext__()
            yield "data: [DONE]\n\n"
        finally:
            await updates.aclose()   # a disconnected client: the request is aborted, its blocks freed
