"""The live fleet's router: a thin HTTP proxy in front of K OpenAI-compatible replicas.

It is not a second scheduler: it picks a replica per request (engine/core/
routing.py's policies, over what replicas.py reads), forwards the body
unchanged and relays the answer, streamed or not, status and error body
included (a bad request gets the replica's own 400, a replica's own 500 is
relayed too: it answered, and may have run part of the request). A replica
that fails before its answer's headers (it refuses the connection, resets or
closes it, the connect times out, or the health watcher marks it down while
the request waits) has sent the client nothing, so the same request goes to
another replica up, picked by the same policy without the replicas that
failed it (at most once per replica); only when none is left does the client
get a 502 naming each. Once the answer has begun (a stream's headers and
chunks go to the client as they come) it is never retried: a replica that
breaks off is reported as a 502 naming it, or ends its stream with an error
event. A client that goes away has its request aborted on the replica (the
connection to it is closed, as the replica does for its own clients). Bodies
over the servers' --max-request-body-size get the 413 the replicas would
give, before the proxy holds them.

A replica that hangs with its port open (SIGSTOP, a wedged GPU) still accepts
connections, and a whole answer's headers come only with the answer, so no
request timeout tells it from a long generation. A health watcher does: it
probes each replica's /health every few seconds, and one that misses several
probes in a row is marked down: picks pass it over (a 503 when none is up),
the requests waiting on its headers go to another replica (a 502 naming it
when none is up), its streams end with an error event. One answered probe
marks it up again.

/health is 200 while any replica can serve (naming the ones that cannot, if
any) and 503 when none can; /metrics is the replicas' pages aggregated as
Prometheus would (prometheus.py) plus the proxy's own routing counters;
/v1/models, /tokenize, /detokenize and /version are the first replica up's
answers (each replica gives the same); /ping is /health; /v1/load_lora_adapter and
/v1/unload_lora_adapter go to every replica (each serves every adapter). The
proxy keeps the adapters loaded that way, and loads those a replica lacks when
it comes back (restarted by the launcher, launch.py, it has only its
--lora-modules) before it sends it requests again. SIGTERM (uvicorn) stops
taking requests and lets those in flight finish; the launcher then stops the
replicas (launch.py).
"""
from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager
from typing import NamedTuple

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.core.block_keys import ROOT_HASH, cache_root
from engine.core.routing import SESSION_HEADER, RouterPolicy
from engine.entrypoints.http_guard import BODY_TIMEOUT
from engine.entrypoints.openai.errors import CLIENT_LEFT, error_body, route_error
from engine.entrypoints.openai.middleware import BodyLimit
from engine.entrypoints.router import prometheus
from engine.entrypoints.router.replicas import LiveRouter, Replica

FORWARDED_HEADERS = (b"authorization", b"content-type", b"accept")
MAX_BODY = 16 << 20       # the servers' default --max-request-body-size
TIMEOUT = httpx.Timeout(None, connect=5.0)     # a generation may take as long as it takes; a dead port may not

# The health watcher's defaults. A replica's /health is answered by its event loop while the engine steps on
# another thread, but on a shared 2-core CPU a busy replica's answer can take a second or more (the GIL, the
# frontend's tokenizer, other processes): a missed probe is 5 s of silence, and two in a row (the second
# PROBE_PERIOD after the first) mean ~12 s without one answer, which no step of a live replica takes. So a
# frozen replica is down 12-14 s after it froze; a lone slow answer marks nothing down.
PROBE_PERIOD = 2.0        # seconds between the end of one probe of a replica and the next
PROBE_TIMEOUT = 5.0       # seconds a probe waits for the answer
PROBE_FAILURES = 2        # probes in a row without an answer that mark a replica down


# A prompt's characters the router tokenizes to score prefix-cache hits (~64K tokens; a longer prompt's later
# blocks do not count): tokenizing a 16 MiB prompt took 22 s of the router's time.
PREFIX_CHARS = 1 << 18
# A token-id prompt's leading ids it scores (as many as PREFIX_CHARS' text gives), and the ids a vocabulary can
# hold: an id beyond them (a bad prompt, which the replica refuses) scores 0 rather than failing the pick.
PREFIX_TOKENS = PREFIX_CHARS // 4
TOKEN_ID_LIMIT = 1 << 31
# Failures before the replica's answer's headers: it sent nothing, so the request may go to another replica.
# A refused or timed-out connect never reached it; a reset or a close before the headers (a replica killed
# mid-request: the kernel closes its sockets) or a write that fails means it died before answering. What it
# ran of the request is lost with it, as the request would be.
BEFORE_ANSWER = (httpx.ConnectError, httpx.ConnectTimeout, httpx.ReadError, httpx.WriteError,
                 httpx.RemoteProtocolError)


class Scored(NamedTuple):
    """What the router scores of a request: its prompt's leading token ids, the root its block keys chain from
    (its LoRA adapter's and cache salt's), and its session (the session header's value, if any)."""
    token_ids: list[int]
    root: int = ROOT_HASH
    session: str | None = None


class ReplicaLost(Exception):
    """The health watcher marked down the replica a request was waiting on."""


def error(message: str, status: int, kind: str = "BadGatewayError") -> JSONResponse:
    """An OpenAI-style error body, as the replicas' own (engine/entrypoints/openai/errors.py)."""
    return JSONResponse(error_body(message, kind, None, status, scrubbed=False), status_code=status)


class Proxy:
    """The replicas, the router, the HTTP client, and the handlers' shared work."""

    def __init__(self, urls: list[str], policy: RouterPolicy, block_size: int, tokenizer=None, *,
                 probe_period: float = PROBE_PERIOD, probe_timeout: float = PROBE_TIMEOUT,
                 probe_failures: int = PROBE_FAILURES, api_key: str | None = None,
                 model_name: str | None = None, session_key: str = SESSION_HEADER) -> None:
        self.replicas = [Replica(i, url.rstrip("/")) for i, url in enumerate(urls)]
        # the base model's served name: any other `model` is a LoRA adapter's, whose name keys its prompt's blocks
        self.model_name = model_name
        self.session_key = session_key      # the request header that names its session (`session` routing)
        # The adapters loaded through the proxy (name -> the load's body) and those unloaded through it since: a
        # replica that comes back may lack the ones and serve the others.
        self.adapters: dict[str, dict] = {}
        self.unloaded: set[str] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        # the key goes only on the proxy's own requests (reads of the replicas' KV events, adapters restored),
        # never on a client's
        self.router = LiveRouter(policy, self.replicas, block_size,
                                 {"authorization": f"Bearer {api_key}"} if api_key else None)
        self.tokenizer = tokenizer          # for prefix-aware picks of text prompts
        self.client: httpx.AsyncClient | None = None
        self.probe_period = probe_period
        self.probe_timeout = probe_timeout
        self.probe_failures = max(1, probe_failures)
        self.watchers: list[asyncio.Task] = []
        self.counts = prometheus.Counts()    # the replicas' counters over scrapes: the fleet's never go down
        self.scraping = asyncio.Lock()

    def read(self, raw: bytes, session: str | None = None) -> tuple:
        """The request's JSON body (None when it is not JSON: the replica answers it with its own 400) and what
        the router scores of it (`session`: its session header's value)."""
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            return None, Scored([], session=session)
        if not isinstance(body, dict):
            return body, Scored([], session=session)
        model, salt = body.get("model"), body.get("cache_salt")
        adapter = model if isinstance(model, str) and model != self.model_name else ""
        return body, Scored(self.token_ids(body), cache_root(adapter, salt if isinstance(salt, str) else None),
                            session)

    def token_ids(self, body) -> list[int]:
        """The prompt's leading token ids as the replica will see them (for prefix scoring only; [] if
        unknown): a text's first PREFIX_CHARS characters, its last token dropped when cut there, as a longer
        text may join that token to the next."""
        if not self.router.policy.uses_prefix or not isinstance(body, dict):
            return []
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
            prompt = prompt[0]                    # a batch: the replica serves them together
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            ids = prompt[:PREFIX_TOKENS]
            return ids if all(0 <= t < TOKEN_ID_LIMIT for t in ids) else []
        if self.tokenizer is None or body.get("truncate_prompt_tokens") is not None:
            return []     # (a truncated prompt's first tokens are not its text's: the replica cuts from the front)
        # (vLLM's add_special_tokens: on by default for a completion's prompt, off for a rendered chat)
        special = body.get("add_special_tokens", "messages" not in body) is True
        try:
            if isinstance(prompt, str):
                return self._leading_ids(prompt, add_special_tokens=special)
            if isinstance(body.get("messages"), list):
                text = self.tokenizer.apply_chat_template(body["messages"], tokenize=False,
                                                          add_generation_prompt=True)
                return self._leading_ids(text, add_special_tokens=special)
        except Exception:   # noqa: BLE001 - the replica says what is wrong with the prompt; it just scores 0
            return []
        return []

    def _leading_ids(self, text: str, add_special_tokens: bool) -> list[int]:
        # (verbose=False: a head past the tokenizer's model_max_length is no warning for the fleet's log)
        ids = list(self.tokenizer(text[:PREFIX_CHARS], add_special_tokens=add_special_tokens,
                                  verbose=False)["input_ids"])
        return ids[:-1] if len(text) > PREFIX_CHARS else ids

    async def pick(self, prompt: Scored, failed: list[Replica] | tuple = ()) -> Replica | None:
        """The policy's replica for a request among those up, but for the ones that `failed` it already (None
        when none is left)."""
        others = [r for r in self.replicas if r not in failed]
        if not others:
            return None
        await self.router.refresh(self.client, others)
        # Read after the refresh: it may have waited on a replica until the watcher marked it down.
        up = [r for r in others if r.up]
        if not up:
            return None
        return self._sent_to(self.router.pick_among(up, prompt.token_ids, time.monotonic(), retry=bool(failed),
                                                    root=prompt.root, session=prompt.session))

    def _sent_to(self, replica: Replica) -> Replica:
        replica.routed += 1
        replica.in_flight += 1
        return replica

    async def forward(self, request: Request) -> Response:
        raw = await _body(request)
        if isinstance(raw, Response):
            return raw
        # The client's bytes as they came (a header may hold any latin-1 byte; the replica judges it).
        headers = [(k, v) for k, v in request.headers.raw if k.lower() in FORWARDED_HEADERS]
        # a 16 MiB body: not on the event loop
        body, prompt = await asyncio.to_thread(self.read, raw, request.headers.get(self.session_key))
        replica = await self.pick(prompt)
        if replica is None:
            return error("no replica is up: " + "; ".join(_stopped_answering(r) for r in self.replicas), 503,
                         "ServiceUnavailableError")
        streamed = isinstance(body, dict) and bool(body.get("stream"))
        exchange = asyncio.ensure_future(self._exchange(replica, prompt, request.url.path, raw, headers,
                                                        streamed))
        leaving = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait((exchange, leaving), return_when=asyncio.FIRST_COMPLETED)
        finally:
            leaving.cancel()
        if exchange.done():
            return exchange.result()
        # The client went away before the answer (a whole answer's headers come only with it): closing the
        # replica's connection aborts the request there, as the replica does for its own clients.
        exchange.cancel()
        return Response(status_code=CLIENT_LEFT)

    async def _exchange(self, replica: Replica, prompt: Scored, path: str, raw: bytes, headers,
                        streamed: bool) -> Response:
        """Send the request to `replica` (to another while they fail before answering) and relay the answer:
        a stream as it comes, a whole answer once read."""
        failed: list[Replica] = []           # the replicas that failed this request before answering
        reasons: list[str] = []
        holding: Replica | None = replica    # whose in-flight count the request holds (none between tries)
        try:
            while True:
                outgoing = self.client.build_request("POST", replica.url + path, content=raw, headers=headers)
                try:
                    upstream = await _unless_lost(replica, self.client.send(outgoing, stream=True))
                    break
                except BEFORE_ANSWER as exc:         # nothing reached the client: another replica may take it
                    reasons.append(self._failed(replica, exc))
                except ReplicaLost:
                    reasons.append(self._lost(replica))
                except httpx.HTTPError as exc:       # not the replica's failing (a request httpx cannot send)
                    holding = None
                    return error("; ".join(reasons + [self._failed(replica, exc)]), 502)
                holding = None                   # released above: a client leaving during the pick owes none
                failed.append(replica)
                replica = await self.pick(prompt, failed)
                if replica is None:
                    return error("; ".join(reasons), 502)    # every replica up failed it, each named
                failed[-1].retried += 1
                holding = replica
            if streamed and upstream.status_code == 200:
                holding = None                   # the relay releases it when the stream ends
                return RelayedStream(_Relay(self, replica, upstream), headers=_passed(upstream.headers))
            try:
                content = await _unless_lost(replica, upstream.aread())
            except httpx.HTTPError as exc:       # it had answered (its headers came): never sent again
                holding = None
                return error(self._failed(replica, exc), 502)
            except ReplicaLost:
                holding = None
                return error(self._lost(replica), 502)
            finally:
                await upstream.aclose()
        except asyncio.CancelledError:           # the client left: the request is no longer in flight
            if holding is not None:
                self._ended(holding)
            raise
        self._ended(replica)
        return Response(content, status_code=upstream.status_code, headers=_passed(upstream.headers))

    def _ended(self, replica: Replica) -> None:
        replica.in_flight -= 1
        replica.down = None

    def _failed(self, replica: Replica, exc: Exception) -> str:
        """Release the request's count on a replica that did not answer it; why, in words."""
        replica.in_flight -= 1
        replica.failed += 1
        replica.down = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return f"{replica.name()} did not answer: {replica.down}"

    def _lost(self, replica: Replica) -> str:
        replica.in_flight -= 1
        replica.failed += 1
        return _stopped_answering(replica)

    # -- the health watcher ---------------------------------------------------------
    def watch(self) -> None:
        """Start probing every replica (the app's lifespan starts it once the client is open)."""
        self.loop = asyncio.get_running_loop()
        self.watchers = [asyncio.ensure_future(self._watch(r)) for r in self.replicas]

    def restarted(self, index: int) -> None:
        """Replica `index`'s process exited and is being started again (the launcher's thread calls this): it is
        down now, without waiting for missed probes, so it gets the fleet's adapters before any request."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._restarting, self.replicas[index])

    @staticmethod
    def _restarting(replica: Replica) -> None:
        if replica.up:
            replica.mark_down()

    async def unwatch(self) -> None:
        for task in self.watchers:
            task.cancel()
        await asyncio.gather(*self.watchers, return_exceptions=True)
        self.watchers = []

    async def _watch(self, replica: Replica) -> None:
        # One loop per replica: a frozen replica's probes, each waiting out its timeout, delay no other's.
        while True:
            await self._probe(replica)
            await asyncio.sleep(self.probe_period)

    async def _probe(self, replica: Replica) -> None:
        """One GET /health. Any answer counts: a replica whose steps fail answers 503 yet still takes the
        requests, one of which must succeed to make it healthy; only silence means it cannot serve."""
        try:
            await self.client.get(replica.url + "/health", timeout=self.probe_timeout)
        except (httpx.HTTPError, OSError):
            replica.misses += 1
            if replica.up and replica.misses >= self.probe_failures:
                replica.mark_down()
            return
        replica.misses = 0
        if not replica.up:
            await self._restore_adapters(replica)
            replica.mark_up()

    async def _restore_adapters(self, replica: Replica) -> None:
        """Bring a replica coming back up to the adapters the fleet serves: those loaded through the proxy (in
        place where it serves the name from another folder: the version its start loaded, or one a load it
        missed replaced) and none of those unloaded through it. Best effort: a change it refuses (a request of
        the adapter still running there, a folder gone) leaves it as it was."""
        if not (self.adapters or self.unloaded):
            return
        headers = self.router.headers
        try:
            listed = (await self.client.get(replica.url + "/v1/models", headers=headers,
                                            timeout=self.probe_timeout)).json()["data"]
            served = {model["id"]: model.get("root") for model in listed}      # (an adapter's root: its folder)
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return
        for name, body in list(self.adapters.items()):
            if name in served and served[name] == body.get("lora_path"):
                continue
            body = body | {"load_inplace": True} if name in served else body
            await self._update(replica, "/v1/load_lora_adapter", json.dumps(body).encode(), headers)
        for name in self.unloaded & served.keys():
            await self._update(replica, "/v1/unload_lora_adapter", json.dumps({"lora_name": name}).encode(),
                               headers)

    async def health(self, request: Request) -> Response:
        """200 while any replica can serve (the fleet serves, so a load balancer keeps it), with the replicas that
        cannot named in a `degraded` body; 503 when none can."""
        answers = await asyncio.gather(*(self._health_of(r) for r in self.replicas))
        bad = [why for why in answers if why is not None]
        if not bad:
            return Response(status_code=200)
        if len(bad) < len(answers):
            return JSONResponse({"status": "degraded", "unhealthy": bad})
        return error(f"unhealthy: {'; '.join(bad)}", 503, "ServiceUnavailableError")

    async def _health_of(self, replica: Replica) -> str | None:
        if not replica.up:                   # without waiting out another probe of a frozen replica
            return _stopped_answering(replica)
        try:
            answer = await self.client.get(replica.url + "/health", timeout=5.0)
        except httpx.HTTPError as exc:
            return f"{replica.name()} is unreachable ({type(exc).__name__})"
        return None if answer.status_code == 200 else f"{replica.name()} answers {answer.status_code}"

    async def metrics(self, request: Request) -> Response:
        async with self.scraping:        # (scrapes taken in turn: an older page read after a newer one would fall)
            pages = await asyncio.gather(*(self._page_of(r) for r in self.replicas))
            families = prometheus.aggregate(pages, self.counts) + self._own_metrics(pages)
        return PlainTextResponse(prometheus.render(families), media_type="text/plain; version=0.0.4")

    async def _page_of(self, replica: Replica):
        if not replica.up:                   # a frozen replica would hold the scrape for the whole timeout
            return None
        try:
            return prometheus.parse((await self.client.get(replica.url + "/metrics", timeout=5.0)).text)
        except httpx.HTTPError:
            return None

    def _own_metrics(self, pages) -> list[prometheus.Family]:
        def family(name, kind, help_, values):
            return prometheus.Family(name, kind, help_, [(name, (("replica", str(r.index)),), float(v))
                                                         for r, v in zip(self.replicas, values)])
        return [family("planner:router_requests_total", "counter", "Requests the router sent to each replica.",
                       [r.routed for r in self.replicas]),
                family("planner:router_requests_in_flight", "gauge", "Requests sent to each replica whose "
                       "answers have not ended.", [r.in_flight for r in self.replicas]),
                family("planner:router_failures_total", "counter", "Requests a replica did not answer, or "
                       "broke off.", [r.failed for r in self.replicas]),
                family("planner:router_replica_up", "gauge", "1 when the replica answers its health checks "
                       "(the router sends it requests), 0 when it is marked down.", [r.up for r in self.replicas]),
                family("planner:router_replica_down_total", "counter", "Times the health watcher marked the "
                       "replica down.", [r.down_marks for r in self.replicas]),
                family("planner:router_retries_total", "counter", "Requests the replica failed before "
                       "answering that the router sent to another replica.", [r.retried for r in self.replicas])]

    async def update_loras(self, request: Request) -> Response:
        """/v1/load_lora_adapter and /v1/unload_lora_adapter: sent to every replica (each serves every adapter).
        All answering 200: the first answer, and the adapter's id kept for prefix-aware picks; else the first
        replica's refusal as it gave it (each holds the same adapters, so each refuses alike), or a 502 naming
        the replicas that did not take it when the others did."""
        raw = await _body(request)
        if isinstance(raw, Response):
            return raw
        headers = [(k, v) for k, v in request.headers.raw if k.lower() in FORWARDED_HEADERS]
        path = request.url.path
        answers = await asyncio.gather(*(self._update(r, path, raw, headers) if r.up else _down(r)
                                         for r in self.replicas))
        taken = [a for a in answers if isinstance(a, httpx.Response) and a.status_code == 200]
        if taken:
            self._track_lora(path, raw)
        if len(taken) == len(answers):
            first = answers[0]
            return Response(first.content, status_code=200, headers=_passed(first.headers))
        refused = next((a for a in answers if isinstance(a, httpx.Response) and a.status_code != 200), None)
        if refused is not None and not taken:
            return Response(refused.content, status_code=refused.status_code, headers=_passed(refused.headers))
        missed = [f"{r.name()}: {a if isinstance(a, str) else a.status_code}" for r, a in zip(self.replicas, answers)
                  if not (isinstance(a, httpx.Response) and a.status_code == 200)]
        return error(f"{len(taken)} of {len(answers)} replicas took it; not " + "; ".join(missed), 502)

    async def _update(self, replica: Replica, path: str, raw: bytes, headers) -> httpx.Response | str:
        try:
            return await self.client.post(replica.url + path, content=raw, headers=headers)
        except httpx.HTTPError as exc:
            return f"did not answer: {type(exc).__name__}"

    def _track_lora(self, path: str, raw: bytes) -> None:
        """A load or unload some replica took: the fleet's adapters, which a replica coming back gets."""
        body = json.loads(raw)
        name = body["lora_name"]
        if path.endswith("/unload_lora_adapter"):
            self.adapters.pop(name, None)
            self.unloaded.add(name)
        else:
            self.adapters[name] = body
            self.unloaded.discard(name)

    async def any_replica(self, request: Request) -> Response:
        """The first replica up's answer to what every replica answers alike (/v1/models, /tokenize,
        /detokenize, /version), each asked in turn; a frozen or dead replica does not hold it up (a GET waits the
        health probe's timeout, a tokenizer's work a minute)."""
        raw = await _body(request)
        if isinstance(raw, Response):
            return raw
        headers = [(k, v) for k, v in request.headers.raw if k.lower() in FORWARDED_HEADERS]
        timeout = self.probe_timeout if request.method == "GET" else 60.0
        reasons = []
        for replica in self.replicas:
            if not replica.up:
                reasons.append(_stopped_answering(replica))
                continue
            try:
                answer = await self.client.request(request.method, replica.url + request.url.path, content=raw,
                                                   headers=headers, timeout=timeout)
            except httpx.HTTPError as exc:
                reasons.append(f"{replica.name()} did not answer: {type(exc).__name__}")
                continue
            return Response(answer.content, status_code=answer.status_code, headers=_passed(answer.headers))
        return error("no replica answered: " + "; ".join(reasons), 503, "ServiceUnavailableError")


async def _body(request: Request) -> bytes | Response:
    """The request's body, or the answer to a client that did not send it within BODY_TIMEOUT (408), or that
    left (or broke its chunked body) before it ended: nobody to answer."""
    try:
        return await asyncio.wait_for(request.body(), BODY_TIMEOUT)
    except asyncio.TimeoutError:
        return error(f"the request body did not arrive within {BODY_TIMEOUT:g} s", 408, "RequestTimeoutError")
    except ClientDisconnect:
        return Response(status_code=CLIENT_LEFT)


def _stopped_answering(replica: Replica) -> str:
    return f"{replica.name()} stopped answering its health checks"


async def _down(replica: Replica) -> str:
    return _stopped_answering(replica)


def _error_event(message: str) -> str:
    """The server-sent events that end a stream the replica did not finish, as a replica ends one that fails."""
    body = json.dumps(error_body(message, "BadGatewayError", None, 502, scrubbed=False))
    return f"data: {body}\n\ndata: [DONE]\n\n"


async def _unless_lost(replica: Replica, awaitable):
    """`awaitable`'s result, unless the watcher marks `replica` down first (ReplicaLost; the work is
    cancelled, which closes its connection). A client that leaves cancels the work too."""
    work = asyncio.ensure_future(awaitable)
    lost = asyncio.ensure_future(replica.lost.wait())
    try:
        await asyncio.wait((work, lost), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        work.cancel()
        raise
    finally:
        lost.cancel()
    if work.done():
        return work.result()
    work.cancel()
    raise ReplicaLost()


def _passed(headers: httpx.Headers) -> dict:
    return {k: v for k, v in headers.items() if k.lower() in ("content-type", "cache-control")}


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone away (its body already read, the next message says so)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own 404 and 405 (with its Allow header), in the words the replicas give them."""
    return JSONResponse(route_error(exc.status_code, request.method, request.url.path, str(exc.detail)),
                        status_code=exc.status_code, headers=exc.headers)


def build_proxy_app(proxy: Proxy, max_body: int = MAX_BODY) -> Starlette:
    @asynccontextmanager
    async def lifespan(app):
        proxy.client = httpx.AsyncClient(timeout=TIMEOUT, limits=httpx.Limits(max_connections=None,
                                                                              max_keepalive_connections=64))
        proxy.watch()
        yield
        await proxy.unwatch()
        await proxy.client.aclose()

    routes = [Route("/v1/completions", proxy.forward, methods=["POST"]),
              Route("/v1/chat/completions", proxy.forward, methods=["POST"]),
              Route("/v1/models", proxy.any_replica, methods=["GET"]),
              Route("/tokenize", proxy.any_replica, methods=["POST"]),
              Route("/detokenize", proxy.any_replica, methods=["POST"]),
              Route("/version", proxy.any_replica, methods=["GET"]),
              Route("/ping", proxy.health, methods=["GET", "POST"]),
              Route("/v1/load_lora_adapter", proxy.update_loras, methods=["POST"]),
              Route("/v1/unload_lora_adapter", proxy.update_loras, methods=["POST"]),
              Route("/health", proxy.health, methods=["GET"]),
              Route("/metrics", proxy.metrics, methods=["GET"])]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: _http_error})
    app.router.redirect_slashes = False      # a trailing slash is a 404, as the replicas say: no redirect built
    #                                          from the client's Host header
    app.add_middleware(BodyLimit, max_bytes=max_body)
    app.state.proxy = proxy
    return app


class _Relay:
    """One stream from a replica to its client: the bytes as they come, and the end of the request, once,
    whether the stream ran to its end, broke off, or never started (a client that leaves right after the
    headers, before the first chunk, would otherwise leave the replica generating and its count held:
    an async generator never started runs no `finally`)."""

    def __init__(self, proxy: "Proxy", replica: Replica, upstream: httpx.Response) -> None:
        self.proxy, self.replica, self.upstream = proxy, replica, upstream
        self.closed = False

    async def chunks(self):
        """The stream's bytes; a replica that breaks off, or is marked down, ends it with an error event."""
        replica = self.replica
        chunks = self.upstream.aiter_raw()
        try:
            while (chunk := await _unless_lost(replica, anext(chunks, None))) is not None:
                yield chunk
        except httpx.HTTPError as exc:
            replica.failed += 1
            replica.down = f"{type(exc).__name__}: {exc}"
            yield _error_event(f"{replica.name()} broke off the stream: {replica.down}")
        except ReplicaLost:
            replica.failed += 1
            yield _error_event(_stopped_answering(replica))
        finally:
            await self.close()

    async def close(self) -> None:
        """Close the replica's connection (aborting the request there if it still runs) and release its
        count; a second call does nothing."""
        if self.closed:
            return
        self.closed = True
        try:
            await self.upstream.aclose()
        finally:
            self.proxy._ended(self.replica)


class RelayedStream(StreamingResponse):
    """A relayed stream's response: whatever becomes of the sending (the client gone before the headers
    or the first chunk, or the send cancelled), the relay is closed when it is over."""

    def __init__(self, relay: _Relay, headers) -> None:
        super().__init__(relay.chunks(), status_code=200, headers=headers)
        self.relay = relay

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.relay.close()
