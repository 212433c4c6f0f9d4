"""uvicorn's h11 protocol with guards against clients that hold connections without finishing a request.

uvicorn closes an idle keep-alive connection, but waits forever for a request whose head never ends (a
"slowloris" client sending a header line now and then, or nothing at all after connecting). Thousands of
such connections ran the server out of file descriptors: it stopped answering, and asyncio logged a
traceback for every failed accept (462,847 in 40 s). Here, as the API server's and the router's protocol:

- a request's head (its request line and headers) must arrive within HEAD_TIMEOUT seconds of the
  connection or of the first byte after the previous answer, or the connection is closed;
- past CONNECTION_CAP open connections (the process's file-descriptor limit less a reserve for the
  engine, its logs and its own clients) a new connection is closed at once, so connections alone never
  exhaust the descriptors.

A body that trickles in after a complete head is bounded by the handlers (BODY_TIMEOUT). A request uvicorn
cannot parse (a bad request line, Content-Length or chunk size) is answered in OpenAI's error shape, as
every other refusal, not uvicorn's plain text.
"""
from __future__ import annotations

import asyncio
import json
import resource

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_TIMEOUT = 30.0              # s from a connection (or a next request's first byte) to its head's end
BODY_TIMEOUT = 120.0             # s a handler waits for a request's whole body
FD_RESERVE = 256                 # descriptors kept for everything but client connections


def connection_cap() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 65536 if soft == resource.RLIM_INFINITY else max(64, soft - FD_RESERVE)


CONNECTION_CAP = connection_cap()


class GuardedH11Protocol(H11Protocol):
    """H11Protocol closing connections whose request head stalls, and any over CONNECTION_CAP."""

    head_timeout = HEAD_TIMEOUT
    connection_cap = CONNECTION_CAP

    def connection_made(self, transport: asyncio.Transport) -> None:   # type: ignore[override]
        super().connection_made(transport)
        self._head_deadline: asyncio.TimerHandle | None = None
        if len(self.connections) > self.connection_cap:
            transport.close()                 # connection_lost follows, and forgets it
            return
        self._watch_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_watching()
        super().connection_lost(exc)

    def _waiting_for_head(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _watch_head(self) -> None:
        """A deadline while a request's head is awaited; none once it has come (the handler reads the body)."""
        if not self._waiting_for_head():
            self._stop_watching()
        elif self._head_deadline is None and not self.transport.is_closing():
            self._head_deadline = self.loop.call_later(self.head_timeout, self._head_overdue)

    def _stop_watching(self) -> None:
        if getattr(self, "_head_deadline", None) is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request it cannot parse, as JSON (engine/entrypoints/openai/errors.py's shape);
        the connection then closes, as uvicorn closes it."""
        body = json.dumps({"error": {"message": f"invalid HTTP request: {msg.rstrip('.')}", "type": "BadRequestError",
                                     "param": None, "code": 400}}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body),
                      h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()

    def _head_overdue(self) -> None:
        self._head_deadline = None
        if self._waiting_for_head() and not self.transport.is_closing():
            self.transport.close()
