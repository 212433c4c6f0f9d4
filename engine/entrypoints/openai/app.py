"""The OpenAI-compatible HTTP API over AsyncEngine (FastAPI).

Endpoints: /v1/completions, /v1/chat/completions (both stream over SSE),
/v1/models, /health, /metrics, /kv_events (the prefix cache's events, for a
router). A request's ``model`` is the served name or one of the LoRA adapters
loaded at start (served_models.py, vLLM's --lora-modules), or since, through
/v1/load_lora_adapter and /v1/unload_lora_adapter when $VLLM_ALLOW_RUNTIME_LORA_UPDATING
allows them as it does in vLLM (the engine loads or drops the adapter between
steps), or found by name in $VLLM_LORA_RESOLVER_CACHE_DIR (vLLM's filesystem
resolver). Every refusal has an OpenAI-style body
``{"error": {"message", "type", "param", "code"}}`` (errors.py) and the server
keeps serving: bodies are parsed and bounded at the edge (protocol.py),
tokenizing and chat templates run off the event loop (frontend.py), a failed
engine step fails only its own requests (async_engine.py), and a client that
goes away has its request aborted, streaming or not.
"""
from __future__ import annotations

import asyncio
import importlib.metadata
import os
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from engine.entrypoints.http_guard import BODY_TIMEOUT
from engine.entrypoints.openai import metrics
from engine.entrypoints.openai.async_engine import AsyncEngine
from engine.entrypoints.openai.errors import CLIENT_LEFT, RequestError, error_body, param_of, route_error
from engine.entrypoints.openai.frontend import Frontend
from engine.entrypoints.openai.kv_events import KvEventLog
from engine.entrypoints.openai.middleware import ApiKeyAuth, BodyLimit, InternalErrors, ResponseCounter
from engine.entrypoints.openai.protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                                               LoadLoRAAdapterRequest, TokenizeRequest, UnloadLoRAAdapterRequest,
                                               _Common, message_dicts, parse_body)
from engine.entrypoints.openai.responses import serve_request
from engine.entrypoints.openai.served_models import LoRAModulePath, ServedModels, resolve_adapter
from engine.llm_engine import load_tokenizer

HANDLERS = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/kv_events",
            "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/tokenize", "/detokenize", "/ping", "/version"}
try:
    VERSION = importlib.metadata.version("paged-planner")     # /version's answer
except importlib.metadata.PackageNotFoundError:              # (run from a checkout that was never installed)
    VERSION = "unknown"
RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
RESOLVER_DIR_ENV = "VLLM_LORA_RESOLVER_CACHE_DIR"


@dataclass(frozen=True)
class ServerOptions:
    """What `planner serve` sets beside the deployment (none of it changes what the engine computes)."""

    api_key: str | None = None                      # required on /v1/* as "Authorization: Bearer <key>"
    max_request_body_size: int = 16 << 20           # bytes; a larger body is refused with 413
    trust_request_chat_template: bool = False       # vLLM's flag: run a request's own chat_template
    chat_template_timeout: float = 2.0              # seconds a chat template may take to render
    # uvicorn: an idle keep-alive connection closes after this. Longer than clients' own pool expiry
    # (httpx 5 s, aiohttp 15 s), so a client does not reuse a connection the server is closing.
    timeout_keep_alive: float = 30.0
    limit_concurrency: int | None = None            # uvicorn: connections + tasks before it answers 503
    # /v1/load_lora_adapter and /v1/unload_lora_adapter, as vLLM serves them when $VLLM_ALLOW_RUNTIME_LORA_UPDATING
    # is 1 or true (its default: off, the routes a 404)
    runtime_lora_updating: bool = field(default_factory=lambda: os.environ.get(
        RUNTIME_LORA_ENV, "0").strip().lower() in ("1", "true"))
    # vLLM's filesystem LoRA resolver ($VLLM_LORA_RESOLVER_CACHE_DIR, with runtime updates allowed): a request
    # naming an adapter not served yet loads the folder of that name from here
    lora_resolver_dir: str | None = field(default_factory=lambda: os.environ.get(RESOLVER_DIR_ENV) or None)
    # vLLM's --enable-prompt-tokens-details: usage.prompt_tokens_details.cached_tokens in answers
    enable_prompt_tokens_details: bool = False


class ServerState:
    """What the handlers share: the engine loop, the frontend, the served models and the statistics."""

    def __init__(self, engine, model_name: str, options: ServerOptions, tokenizer_folder: str | None,
                 lora_modules: list[LoRAModulePath] | None = None) -> None:
        self.engine = engine
        self.model_name = model_name
        self.models = ServedModels(model_name, lora_modules)
        self.models.load(engine)        # before anything listens: a bad adapter stops the start
        self.options = options
        # The engine's tokenizer is used inside steps (another thread); the frontend has its own,
        # so encoding never races with decoding.
        source = tokenizer_folder or (engine.tokenizer.name_or_path if engine.tokenizer is not None else None)
        tokenizer = load_tokenizer(source) if source else None
        self.frontend = Frontend(tokenizer, engine.max_model_len, render_timeout=options.chat_template_timeout,
                                 trust_request_chat_template=options.trust_request_chat_template)
        self.stats = metrics.ServerStats(engine.max_model_len)
        self.kv_events = KvEventLog(engine)
        self.async_engine: AsyncEngine | None = None
        self.created = int(time.time())

    @property
    def healthy(self) -> bool:
        return self.async_engine is not None and self.async_engine.healthy


def build_app(engine, model_name: str, options: ServerOptions | None = None,
              tokenizer_folder: str | None = None, lora_modules: list[LoRAModulePath] | None = None) -> FastAPI:
    """The ASGI app: routes, error handlers, and the middleware (outermost first: response counts,
    the API key on /v1/*, the body-size limit, a last-resort 500). `lora_modules`: the adapters served
    beside the base model (the engine needs enable_lora), loaded here; a ValueError for one it cannot serve."""
    options = options or ServerOptions()
    if options.lora_resolver_dir and not os.path.isdir(options.lora_resolver_dir):
        raise ValueError(f"{RESOLVER_DIR_ENV} must name a folder of LoRA adapters (vLLM's filesystem resolver); "
                         f"{options.lora_resolver_dir!r} is not one")
    state = ServerState(engine, model_name, options, tokenizer_folder, lora_modules)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.async_engine = AsyncEngine(engine, state.stats)
        state.async_engine.kv_events = state.kv_events
        state.async_engine.start()
        yield
        await state.async_engine.close()   # in-flight requests finish first
        state.frontend.close()

    # No redirect of /v1/completions/ to /v1/completions: an API client gets a JSON 404, not a 307.
    app = FastAPI(title="paged-planner OpenAI-compatible server", lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False)
    app.state.server = state
    _add_error_handlers(app)
    _add_routes(app, state)
    app.add_middleware(InternalErrors)
    app.add_middleware(BodyLimit, max_bytes=options.max_request_body_size)
    if options.api_key:
        app.add_middleware(ApiKeyAuth, api_key=options.api_key)
    app.add_middleware(ResponseCounter, counts=state.stats.http, handlers=HANDLERS)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestError)
    async def _refused(request: Request, exc: RequestError):
        return JSONResponse(error_body(str(exc), exc.kind, exc.param, exc.status), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        body = route_error(exc.status_code, request.method, request.url.path, str(exc.detail))
        return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        # A query parameter of the wrong type (/kv_events?after=x): a 400 as vLLM gives, not FastAPI's 422.
        first = exc.errors()[0]
        param = param_of(tuple(first.get("loc", ())[1:]))
        message = f"{param or 'the request'}: {first.get('msg', 'invalid')}"
        return JSONResponse(error_body(message, "BadRequestError", param, 400), status_code=400)


def _add_routes(app: FastAPI, state: ServerState) -> None:
    engine = state.engine

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health():
        if state.healthy:
            return Response(status_code=200)
        why = state.async_engine.why_not() if state.async_engine is not None else "starting"
        return JSONResponse(error_body(f"unhealthy: {why}", "ServiceUnavailableError", None, 503), status_code=503)

    @app.api_route("/v1/models", methods=["GET", "HEAD"])
    async def models():
        return {"object": "list", "data": state.models.cards(state.created, engine.max_model_len)}

    @app.api_route("/metrics", methods=["GET", "HEAD"])
    async def prometheus():
        return PlainTextResponse(metrics.render(engine, state.stats, state.model_name),
                                 media_type="text/plain; version=0.0.4")

    @app.api_route("/kv_events", methods=["GET", "HEAD"])
    async def kv_events(after: int = 0):
        # For a prefix-aware router (engine/entrypoints/router): the prefix cache's BlockStored /
        # BlockRemoved events numbered `after` and later, or a snapshot (kv_events.py).
        return state.kv_events.since(after)

    @app.post("/v1/completions")
    async def completions(request: Request):
        arrival = engine.clock()
        _check_json(request)
        raw = await _body(request)      # read before the disconnect watch starts listening
        if raw is None:
            return Response(status_code=CLIENT_LEFT)
        return await _until_disconnect(request, _completion(state, raw, arrival))

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        arrival = engine.clock()
        _check_json(request)
        raw = await _body(request)
        if raw is None:
            return Response(status_code=CLIENT_LEFT)
        return await _until_disconnect(request, _chat(state, raw, arrival))

    @app.post("/tokenize")
    async def tokenize(request: Request):
        return await _tokenizer_call(request, state, _tokenize)

    @app.post("/detokenize")
    async def detokenize(request: Request):
        return await _tokenizer_call(request, state, _detokenize)

    @app.api_route("/ping", methods=["GET", "POST"])     # vLLM's (SageMaker's) health probe
    async def ping():
        return await health()

    @app.get("/version")
    async def version():
        return {"version": VERSION}

    if state.options.runtime_lora_updating:
        @app.post("/v1/load_lora_adapter")
        async def load_lora_adapter(request: Request):
            return await _update_lora(request, state, LoadLoRAAdapterRequest)

        @app.post("/v1/unload_lora_adapter")
        async def unload_lora_adapter(request: Request):
            return await _update_lora(request, state, UnloadLoRAAdapterRequest)


async def _update_lora(request: Request, state: ServerState, kind: type) -> Response:
    """A LoRA adapter loaded (`kind` LoadLoRAAdapterRequest) or dropped by the engine between two steps, then
    served or not: vLLM's text answer, or its refusal."""
    raw = await _body(request)
    if raw is None:
        return Response(status_code=CLIENT_LEFT)
    body = parse_body(raw, kind)
    _check_serving(state)
    models, engine = state.models, state.engine
    await models.hold(body.lora_name)
    try:
        if kind is LoadLoRAAdapterRequest:
            lora = models.to_load(body.lora_name, body.lora_path, body.load_inplace)
            call, keep, said_done = (lambda: _load(engine, lora, body.load_inplace)), models.add, "added"
        else:
            lora = models.to_unload(body.lora_name)
            call, keep, said_done = (lambda: _unload(engine, lora)), models.remove, "removed"
        await state.async_engine.between_steps(call)
        keep(lora)
    finally:
        models.done(body.lora_name)
    return PlainTextResponse(f"Success: LoRA adapter '{lora.lora_name}' {said_done} successfully.")


def _load(engine, lora, inplace: bool) -> None:
    """Load `lora` into the engine (in place: its old weights dropped first); the engine's refusal as a 400."""
    try:
        if inplace:
            engine.remove_lora(lora.lora_int_id)
        engine.add_lora(lora)
    except ValueError as exc:
        raise RequestError(f"Loading lora {lora.lora_name} failed: {exc}", param="lora_path") from None


def _unload(engine, lora) -> None:
    try:
        engine.remove_lora(lora.lora_int_id)
    except ValueError as exc:   # requests still run with it
        raise RequestError(f"Failed to remove lora adapter '{lora.lora_name}' from the engine: {exc}; unload "
                           f"it once they have finished", param="lora_name", status=409) from None


def _check_json(request: Request) -> None:
    """vLLM's validate_json_request: a body that does not say it is JSON is refused before it is read."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise RequestError("Unsupported Media Type: Only 'application/json' is allowed")


async def _body(request: Request) -> bytes | None:
    """The request's body, or None when the client left while sending it (not a server error); 408 when it
    has not all come within BODY_TIMEOUT seconds (a client trickling it would hold its connection forever)."""
    try:
        return await asyncio.wait_for(request.body(), BODY_TIMEOUT)
    except ClientDisconnect:
        return None
    except asyncio.TimeoutError:
        raise RequestError(f"the request body did not arrive within {BODY_TIMEOUT:g} s", status=408) from None


async def _completion(state: ServerState, raw: bytes, arrival: float):
    body = await asyncio.to_thread(parse_body, raw, CompletionRequest)     # a 16 MiB body: not on the loop
    lora = await _check_served(state, body)
    prompt = body.single_prompt()
    if isinstance(prompt, str):
        token_ids = await state.frontend.encode(prompt, add_special_tokens=body.add_special_tokens)
    else:
        token_ids, prompt = list(prompt), None
    token_ids, prompt = _truncated(state, body, token_ids, prompt)
    params = _params(state, body, body.max_tokens, body.logprobs, token_ids)
    return await serve_request(state, body, "cmpl", prompt, token_ids, params, arrival, chat=False, lora=lora)


async def _chat(state: ServerState, raw: bytes, arrival: float):
    body = await asyncio.to_thread(parse_body, raw, ChatCompletionRequest)
    lora = await _check_served(state, body)
    text = await state.frontend.render_chat(body.message_dicts(), body.chat_template, body.add_generation_prompt,
                                            body.continue_final_message, body.chat_template_kwargs)
    token_ids = await state.frontend.encode(text, param="messages", add_special_tokens=body.add_special_tokens)
    token_ids, text = _truncated(state, body, token_ids, text)
    params = _params(state, body, body.wanted_max_tokens(), body.wanted_logprobs(), token_ids)
    return await serve_request(state, body, "chatcmpl", text, token_ids, params, arrival, chat=True, lora=lora)


def _truncated(state: ServerState, body: _Common, token_ids: list[int], text: str | None):
    """The prompt's ids and text, cut to the request's truncate_prompt_tokens (then the text is not the prompt's)."""
    kept = body.truncated(token_ids, state.engine.max_model_len)
    return kept, text if len(kept) == len(token_ids) else None


async def _tokenizer_call(request: Request, state: ServerState, handle):
    _check_json(request)
    raw = await _body(request)
    if raw is None:
        return Response(status_code=CLIENT_LEFT)
    return await handle(state, raw)


async def _tokenize(state: ServerState, raw: bytes) -> dict:
    """vLLM's /tokenize: a prompt's or a chat's ids, as a completion or a chat request would send them."""
    body = await asyncio.to_thread(parse_body, raw, TokenizeRequest)
    await _check_served(state, body)
    frontend = state.frontend
    if body.messages is None:
        ids = await frontend.tokenize(body.prompt, add_special_tokens=body.add_special_tokens is not False)
    else:
        text = await frontend.render_chat(message_dicts(body.messages), body.chat_template,
                                          body.add_generation_prompt, body.continue_final_message,
                                          body.chat_template_kwargs)
        ids = await frontend.tokenize(text, param="messages", add_special_tokens=body.add_special_tokens is True)
    strs = await frontend.token_strs(ids) if body.return_token_strs else None
    return {"count": len(ids), "max_model_len": state.engine.max_model_len, "tokens": ids, "token_strs": strs}


async def _detokenize(state: ServerState, raw: bytes) -> dict:
    body = await asyncio.to_thread(parse_body, raw, DetokenizeRequest)
    await _check_served(state, body)
    vocab = state.engine.runner.vocab_size
    bad = next((t for t in body.tokens if t >= vocab), None)
    if bad is not None:
        raise RequestError(f"token id {bad} is out of range: the model's vocabulary has {vocab} tokens",
                           param="tokens")
    return {"prompt": await state.frontend.decode(body.tokens)}


async def _until_disconnect(request: Request, work):
    """Run a handler until it answers or the client goes away; then it is cancelled, which aborts its
    request in the engine (vLLM's with_cancellation does the same for non-streaming requests)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        watch.cancel()
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return Response(status_code=CLIENT_LEFT)


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


# -- request checks -------------------------------------------------------------------
async def _check_served(state: ServerState, body: _Common):
    """The LoRA adapter the request runs with (None: the base model); 503 while not serving, and vLLM's 404
    NotFoundError for a model this server does not serve (unless its resolver finds and loads it)."""
    _check_serving(state)
    try:
        return state.models.lora_for(body.model)
    except RequestError:
        lora = await _resolved(state, body.model)
        if lora is None:
            raise
        return lora


async def _resolved(state: ServerState, name: str):
    """An adapter not served yet that vLLM's filesystem resolver finds (runtime LoRA updates allowed and
    $VLLM_LORA_RESOLVER_CACHE_DIR set, as vLLM asks), loaded now; None when it finds none; vLLM's 400 when it
    finds one the engine cannot load."""
    options = state.options
    if not (options.runtime_lora_updating and options.lora_resolver_dir):
        return None
    path = await asyncio.to_thread(resolve_adapter, options.lora_resolver_dir, name, state.engine.deployment.model)
    if path is None:
        return None
    models = state.models
    await models.hold(name)
    try:
        lora = models.adapters.get(name)          # (another request's resolution may have loaded it meanwhile)
        if lora is None:
            lora = models.to_load(name, path)
            try:
                await state.async_engine.between_steps(lambda: state.engine.add_lora(lora))
            except ValueError:
                raise RequestError(f"LoRA adapter '{name}' was found but could not be loaded.", param="model",
                                   kind="BadRequestError") from None
            models.add(lora)
        return lora
    finally:
        models.done(name)


def _check_serving(state: ServerState) -> None:
    if state.async_engine is None or not state.async_engine.serving:
        why = state.async_engine.why_not() if state.async_engine is not None else "starting"
        raise RequestError(f"the engine is not serving now ({why})", status=503)


def _params(state: ServerState, body: _Common, max_tokens: int | None, logprobs: int | None,
            token_ids: list[int]):
    engine = state.engine
    limit = engine.max_model_len
    vocab = engine.runner.vocab_size
    param = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
    if len(token_ids) >= limit:
        raise RequestError(f"This model's maximum context length is {limit} tokens. However, your prompt has "
                           f"{len(token_ids)} tokens, leaving no room for a completion.", param=param)
    bad = next((t for t in token_ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise RequestError(f"token id {bad} is out of range: the model's vocabulary has {vocab} tokens",
                           param=param)
    if max_tokens is None:
        max_tokens = limit - len(token_ids)
    elif len(token_ids) + max_tokens > limit:
        raise RequestError(f"This model's maximum context length is {limit} tokens. However, you requested "
                           f"{len(token_ids) + max_tokens} tokens ({len(token_ids)} in the prompt, {max_tokens} "
                           f"in the completion). Please reduce the length of the prompt or completion.",
                           param="max_completion_tokens" if getattr(body, "max_completion_tokens", None)
                           else "max_tokens")
    params = body.sampling_params(max_tokens, logprobs, vocab)
    reason = engine.unservable(token_ids, params)
    if reason is not None:    # refused now, not queued to be refused (or cut short) later
        param = ("use_beam_search" if params.use_beam_search else "best_of" if params.best_of > params.n else
                 "n" if params.best_of > 1 else "max_tokens")
        raise RequestError(f"the request cannot be served: {reason}", param=param)
    return params
