"""Errors of /v1/messages in Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`,
so that the `anthropic` client raises its own exceptions (BadRequestError, AuthenticationError,
NotFoundError, RateLimitError, InternalServerError, ...).

The app answers every error in OpenAI's shape, from wherever it comes (the guard's 401 and 413,
a route's refusal, an unknown path or method); `AnthropicErrors`, in front of the app, rewrites
the error answers of the Messages paths: the same status, the error `type` Anthropic gives that
status, and the message led by the field it names (Anthropic's errors have no `param`:
"temperature: temperature must be in [0, 1] ...")."""

from __future__ import annotations

import json

PATHS = ("/v1/messages", "/v1/messages/")  # the route and everything under it
# the HTTP status -> Anthropic's error type. 503 (the executor is unavailable) stays 503, which
# load balancers and health checks read; Anthropic sends overloaded_error (as 529) for it.
TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
         503: "overloaded_error", 529: "overloaded_error"}


def anthropic_error(status: int, message: str, param: str | None = None) -> dict:
    if param and not message.startswith(param):
        message = f"{param}: {message}"
    kind = TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def is_messages_path(path: str) -> bool:
    return path == PATHS[0] or path.startswith(PATHS[1])


def _rewritten(status: int, body: bytes) -> bytes | None:
    """An OpenAI-shaped error body in Anthropic's shape; None when the body is not one."""
    try:
        error = json.loads(body)["error"]
        message, param = error["message"], error.get("param")
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(message, str):
        return None
    return json.dumps(anthropic_error(status, message, param if isinstance(param, str) else None)).encode()


class AnthropicErrors:
    """Pure ASGI: the error answers (status >= 400) of the Messages paths in Anthropic's shape;
    every other answer passes untouched (a stream's events are written in Anthropic's shape
    by job.py)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not is_messages_path(scope["path"]):
            return await self.app(scope, receive, send)
        start: dict | None = None
        chunks: list[bytes] = []

        async def send_(message):
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message  # held until its body is whole
                return
            if message["type"] != "http.response.body" or start is None:
                return await send(message)
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = b"".join(chunks)
            new = _rewritten(start["status"], body)
            if new is not None:
                headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
                start = dict(start, headers=[*headers, (b"content-length", str(len(new)).encode())])
                body = new
            await send(start)
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, send_)
