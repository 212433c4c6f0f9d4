"""ASGI middleware of the server: response counts, the API key, the body-size limit, and a last-resort 500.

Pure ASGI (no BaseHTTPMiddleware), so streaming responses and disconnects pass
through untouched. Each answers in OpenAI's error shape (errors.py).
"""
from __future__ import annotations

import hashlib
import hmac
import logging

from engine.entrypoints.openai.errors import send_error

log = logging.getLogger("engine.entrypoints.openai")


class ResponseCounter:
    """Counts answered requests by handler, method and status class ("2xx", "4xx", ...), as vLLM's
    ``http_requests_total`` (prometheus-fastapi-instrumentator) does; paths no route serves count as "none"."""

    def __init__(self, app, counts: dict, handlers: set[str]) -> None:
        self.app = app
        self.counts = counts
        self.handlers = handlers

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500

        async def counting_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
        try:
            await self.app(scope, receive, counting_send)
        finally:
            path = scope.get("path", "")
            key = (path if path in self.handlers else "none", scope.get("method", ""), f"{status // 100}xx")
            self.counts[key] = self.counts.get(key, 0) + 1


class ApiKeyAuth:
    """``Authorization: Bearer <key>`` required on /v1/* (vLLM's AuthenticationMiddleware) and on /kv_events,
    whose block hashes would tell anyone whether a given prompt was served; compared in constant time, on
    digests, so neither timing nor length tells anything about the key."""

    def __init__(self, app, api_key: str) -> None:
        self.app = app
        self.expected = hashlib.sha256(b"Bearer " + api_key.encode()).digest()

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] == "http" and scope.get("method") != "OPTIONS" and (path.startswith("/v1")
                                                                               or path == "/kv_events"):
            given = dict(scope.get("headers", [])).get(b"authorization", b"")
            if not hmac.compare_digest(hashlib.sha256(given).digest(), self.expected):
                return await send_error(send, 401, "Unauthorized: send the server's API key as "
                                        "'Authorization: Bearer <key>'", headers=[(b"www-authenticate", b"Bearer")])
        return await self.app(scope, receive, send)


class BodyTooLarge(Exception):
    """The request body ran over the limit while being read."""


class BodyLimit:
    """Refuses with 413 a body over ``max_bytes``: at once when Content-Length says so, else as it is read."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await send_error(send, 413, self._message())
        seen = 0
        started = False

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge
            return message

        async def watching_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)
        try:
            await self.app(scope, limited_receive, watching_send)
        except BodyTooLarge:
            if not started:
                await send_error(send, 413, self._message())

    def _message(self) -> str:
        return f"the request body is larger than this server takes ({self.max_bytes} bytes; --max-request-body-size)"


class InternalErrors:
    """Whatever escapes a handler becomes a 500 in OpenAI's shape, and the connection stays usable
    (uvicorn closes a connection whose application raised)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def watching_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)
        try:
            await self.app(scope, receive, watching_send)
        except BodyTooLarge:
            raise
        except Exception as exc:
            log.exception("unhandled error on %s", scope.get("path"))
            if not started:
                await send_error(send, 500, f"internal error: {type(exc).__name__}: {exc}")
