"""The OpenAI-compatible HTTP API over AsyncEngine (FastAPI).

Endpoints: /v1/completions, /v1/chat/completions (both stream over SSE),
/v1/models, /health, /metrics. Every refusal is a 400 with an OpenAI-style
error body ``{"error": {"message", "type", "param", "code"}}``, and the server
keeps serving.
"""
from __future__ import annotations

import json
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from engine.entrypoints.openai import metrics
from engine.llm_engine import load_tokenizer
from engine.entrypoints.openai.async_engine import AsyncEngine, Update
from engine.entrypoints.openai.protocol import (ChatCompletionRequest, CompletionRequest, RequestError, _Common,
                                    error_body)


class ServerState:
    """What the handlers share: the engine loop, the frontend tokenizer and the served name."""

    def __init__(self, engine, model_name: str, folder: str) -> None:

        self.engine = engine
        self.model_name = model_name
        self.folder = folder
        # The engine's tokenizer is used inside steps (another thread); the
        # frontend has its own, so encoding never races with decoding.
        self.tokenizer = load_tokenizer(engine.tokenizer.name_or_path) if engine.tokenizer is not None else None
        self.stats = metrics.ServerStats()
        self.async_engine: AsyncEngine | None = None
        self.created = int(time.time())


def build_app(engine, model_name: str, folder: str) -> FastAPI:
    state = ServerState(engine, model_name, folder)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.async_engine = AsyncEngine(engine, state.stats)
        state.async_engine.start()
        yield
        await state.async_engine.close()   # in-flight requests finish first

    app = FastAPI(title="paged-planner OpenAI-compatible server", lifespan=lifespan)
    app.state.server = state

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        first = errors[0] if errors else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            message = f"the request body is not valid JSON ({message})"
        elif where:
            message = f"{where}: {message}"
        return JSONResponse(error_body(message, param=where or None), status_code=400)

    @app.exception_handler(RequestError)
    async def _refused(request: Request, exc: RequestError):
        return JSONResponse(error_body(str(exc), exc.kind, exc.param, exc.status), status_code=exc.status)

    @app.get("/health")
    async def health():
        ok = state.async_engine is not None and state.async_engine.healthy
        return Response(status_code=200 if ok else 503)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": state.model_name, "object": "model", "created": state.created, "owned_by": "paged-planner",
            "root": state.folder, "parent": None, "max_model_len": engine.max_model_len}]}

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(metrics.render(engine, state.stats, state.model_name),
                                 media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        arrival = engine.clock()
        _check_model(state, body)
        prompt = body.single_prompt()
        if isinstance(prompt, str):
            token_ids = _encode(state, prompt)
        else:
            token_ids, prompt = list(prompt), None
        params = _params(state, body, body.max_tokens, body.logprobs, token_ids)
        return await _serve(state, request, body, "cmpl", prompt, token_ids, params, arrival, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request):
        arrival = engine.clock()
        _check_model(state, body)
        text = _apply_chat_template(state, body)
        token_ids = _encode(state, text, add_special_tokens=False)
        params = _params(state, body, body.wanted_max_tokens(), body.wanted_logprobs(), token_ids)
        return await _serve(state, request, body, "chatcmpl", text, token_ids, params, arrival, chat=True)

    return app


# -- request checks -------------------------------------------------------------------
def _check_model(state: ServerState, body: _Common) -> None:
    if body.model is not None and body.model not in (state.model_name, state.folder):
        raise RequestError(f"The model `{body.model}` does not exist (this server serves `{state.model_name}`).",
                           param="model", kind="NotFoundError")


def _encode(state: ServerState, text: str, add_special_tokens: bool = True) -> list[int]:
    if state.tokenizer is None:
        raise RequestError("this model has no tokenizer: send the prompt as a list of token ids", param="prompt")
    return state.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]


def _apply_chat_template(state: ServerState, body: ChatCompletionRequest) -> str:
    tok = state.tokenizer
    template = body.chat_template or (getattr(tok, "chat_template", None) if tok is not None else None)
    if tok is None or not template:
        raise RequestError("this model has no chat template (none in its folder's tokenizer_config.json): "
                           "use /v1/completions, or pass chat_template", param="messages")
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    try:
        return tok.apply_chat_template(messages, chat_template=template, tokenize=False,
                                       add_generation_prompt=body.add_generation_prompt)
    except Exception as exc:   # a template that does not render these messages
        raise RequestError(f"the chat template failed on these messages: {exc}", param="messages") from None


def _params(state: ServerState, body: _Common, max_tokens: int | None, logprobs: int | None,
            token_ids: list[int]):
    engine = state.engine
    limit = engine.max_model_len
    vocab = engine.runner.vocab_size
    bad = next((t for t in token_ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise RequestError(f"token id {bad} is out of range: the model's vocabulary has {vocab} tokens",
                           param="prompt")
    if len(token_ids) >= limit:
        raise RequestError(f"This model's maximum context length is {limit} tokens. However, your prompt has "
                           f"{len(token_ids)} tokens, leaving no room for a completion.", param="prompt")
    if max_tokens is None:
        max_tokens = limit - len(token_ids)
    elif len(token_ids) + max_tokens > limit:
        raise RequestError(f"This model's maximum context length is {limit} tokens. However, you requested "
                           f"{len(token_ids) + max_tokens} tokens ({len(token_ids)} in the prompt, {max_tokens} "
                           f"in the completion). Please reduce the length of the prompt or completion.",
                           param="max_tokens")
    params = body.sampling_params(max_tokens, logprobs)
    alloc = engine.allocator
    if params.best_of > engine.scheduler.config.max_num_seqs:
        raise RequestError(f"n/best_of {params.best_of} exceeds the server's max_num_seqs "
                           f"{engine.scheduler.config.max_num_seqs}", param="n")
    if -(-len(token_ids) // alloc.block_size) > alloc.num_gpu_blocks:
        raise RequestError(f"the prompt needs more KV cache than the server has "
                           f"({alloc.num_gpu_blocks} blocks of {alloc.block_size} tokens)", param="prompt")
    return params


# -- responses ------------------------------------------------------------------------
def _logprobs_block(deltas_logprobs, token_ids, chat: bool, want_top: int):
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


async def _serve(state: ServerState, request: Request, body, prefix: str, prompt_text, token_ids, params,
                 arrival: float, *, chat: bool):
    request_id = f"{prefix}-{uuid.uuid4().hex}"
    created = int(time.time())
    updates = state.async_engine.generate(request_id, {"prompt_token_ids": token_ids, "prompt": prompt_text},
                                          params, arrival, stream=body.stream)
    want_top = params.logprobs or 0
    kind = "chat.completion" if chat else "text_completion"
    if not body.stream:
        final = None
        async for update in updates:
            if update.error is not None:
                raise RequestError(update.error)
            final = update.final
        choices = []
        for o in final.outputs:
            lp = _logprobs_block(o.logprobs, o.token_ids, chat, want_top)
            if chat:
                choices.append({"index": o.index, "message": {"role": "assistant", "content": o.text or ""},
                                "logprobs": lp, "finish_reason": o.finish_reason, "stop_reason": o.stop_reason})
            else:
                choices.append({"index": o.index, "text": o.text or "", "logprobs": lp,
                                "finish_reason": o.finish_reason, "stop_reason": o.stop_reason})
        completion_tokens = sum(len(o.token_ids) for o in final.outputs)
        return {"id": request_id, "object": kind, "created": created, "model": state.model_name,
                "choices": choices, "usage": {"prompt_tokens": len(token_ids),
                                              "completion_tokens": completion_tokens,
                                              "total_tokens": len(token_ids) + completion_tokens}}

    # Streaming: wait for the request to be accepted or refused before the 200 goes out.
    first: Update = await updates.__anext__()
    if first.error is not None:
        await updates.aclose()
        raise RequestError(first.error)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    chunk_kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(choices, usage=None) -> str:
        doc = {"id": request_id, "object": chunk_kind, "created": created, "model": state.model_name,
               "choices": choices}
        if include_usage:
            doc["usage"] = usage
        return f"data: {json.dumps(doc, separators=(',', ':'))}\n\n"

    async def events():
        completion_tokens = 0
        if chat:   # the role comes first, as OpenAI sends it
            yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                          "finish_reason": None} for i in range(params.n)])
        update = first
        try:
            while True:
                if update.error is not None:
                    yield f"data: {json.dumps(error_body(update.error, 'InternalServerError', None, 500))}\n\n"
                    return
                choices = []
                for d in update.seqs:
                    completion_tokens += len(d.token_ids)
                    lp = _logprobs_block(d.logprobs, d.token_ids, chat, want_top)
                    if chat:
                        choices.append({"index": d.index, "delta": {"content": d.text}, "logprobs": lp,
                                        "finish_reason": d.finish_reason, "stop_reason": d.stop_reason})
                    else:
                        choices.append({"index": d.index, "text": d.text, "logprobs": lp,
                                        "finish_reason": d.finish_reason, "stop_reason": d.stop_reason})
                if choices:
                    yield chunk(choices)
                if update.final is not None:
                    break
                update = await updates.__anext__()
            if include_usage:
                yield chunk([], {"prompt_tokens": len(token_ids), "completion_tokens": completion_tokens,
                                 "total_tokens": len(token_ids) + completion_tokens})
            yield "data: [DONE]\n\n"
        finally:
            await updates.aclose()   # a disconnected client: the request is aborted, its blocks freed

    return StreamingResponse(events(), media_type="text/event-stream")
