"""OpenAI-shaped error bodies for every status the server answers, and the exceptions that carry them.

Every refusal, whatever raised it (a field check, the router's 404/405, the
body-size limit, the API key, an engine failure), reaches the client as
``{"error": {"message", "type", "param", "code"}}`` with the HTTP status in
``code``, as vLLM's server answers (``ErrorResponse``/``ErrorInfo`` in
vllm/entrypoints/openai/engine/protocol.py, built by ``create_error_response``
in serving.py). ``param`` names the request field at fault, never a position
in the body. Messages never carry a path of this machine.
"""
from __future__ import annotations

import json
import re

# The type of each status, as the openai client names the errors it raises.
ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError",
               404: "NotFoundError", 405: "MethodNotAllowedError", 408: "RequestTimeoutError",
               413: "RequestTooLargeError", 415: "UnsupportedMediaTypeError",
               422: "UnprocessableEntityError", 429: "RateLimitError", 500: "InternalServerError",
               503: "ServiceUnavailableError"}

CLIENT_LEFT = 499      # nginx's "client closed request": the answer to a client that left (nobody reads it)

# An absolute path of two or more parts (/home/me/.cache/x, C:\models\y): replaced in every message.
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[\\/][\w.@+~-]+){2,}[\\/]?")


def said(path: str, most: int = 200) -> str:
    """A client's path as it sent it, cut short (a 60 KB URL is not echoed back whole)."""
    return path if len(path) <= most else path[:most] + "..."


def route_error(status: int, method: str, path: str, detail: str) -> dict:
    """The body of the router's 404 and 405 (vLLM's http_exception_handler shapes them), on a replica and on
    the fleet's proxy alike. The route is the client's own words, never a path of this machine: said as sent."""
    message = {404: f"no route {said(path)}", 405: f"{method} is not allowed on {said(path)}"}.get(status)
    return error_body(message or detail, ERROR_TYPES.get(status, "APIError"), None, status,
                      scrubbed=message is None)


class RequestError(ValueError):
    """A request this server refuses: becomes an OpenAI-style error body with this status."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400,
                 kind: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.status = status
        self.kind = kind or ERROR_TYPES.get(status, "APIError")


def scrub(message: str) -> str:
    """The message without machine paths (the model's cache folder, a library's file)."""
    return _PATH.sub("<path>", message)


def error_body(message: str, kind: str = "BadRequestError", param: str | None = None, code: int = 400, *,
               scrubbed: bool = True) -> dict:
    """The body; `scrubbed=False` for a message made only of what the client sent (a route it asked for)."""
    return {"error": {"message": scrub(message) if scrubbed else message, "type": kind, "param": param,
                      "code": code}}


def error_bytes(status: int, message: str, param: str | None = None) -> bytes:
    return json.dumps(error_body(message, ERROR_TYPES.get(status, "APIError"), param, status)).encode()


async def send_error(send, status: int, message: str, param: str | None = None,
                     headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """Answer an ASGI request with an error body (for middleware, before any route runs)."""
    body = error_bytes(status, message, param)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


def param_of(loc: tuple) -> str | None:
    """A request field's name from a pydantic error location: ('messages', 0, 'role') -> 'messages[0].role'.

    Union tags (``str``, ``list[int]``, ``function-after[...]``) are pydantic's, not fields, and are left out."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part not in _TYPE_TAGS and not any(c in part for c in "[]-"):
            out += f".{part}" if out else part
    return out or None


_TYPE_TAGS = {"body", "str", "int", "float", "bool", "list", "dict", "none", "literal_error", "tagged-union"}
