"""One access-log line per request on both doors of the API process (logger `llmserve.access`):
which call, how it ended, its tokens and its duration (docs/metrics.md, "Logs").

A request's `Record` is made where the request enters (the gRPC guard in handlers.py, the ASGI
middleware `HttpAccessLog` around the HTTP app) and made current (a context variable, so the
route fills it without passing it around: `current()`); the route adds the request id and token
counts, `internal_error` the error id the client got and the real message. The door's hook
emits the record once, when the call ends (a stream: when it finished, was cancelled or failed):
one log call per request, a few additions per streamed message.

Levels: OK and refused (the client's fault: INVALID_ARGUMENT, RESOURCE_EXHAUSTED, HTTP 4xx) and
cancelled at INFO, UNAVAILABLE / HTTP 503 at WARNING, INTERNAL / HTTP 500 at ERROR with the error
id. --disable-log-requests raises the logger to WARNING: failures are still logged (the error id
a client reports must be findable), nothing else is.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
import uuid
from contextvars import ContextVar

log = logging.getLogger("llmserve.access")
MAX_MESSAGE_CHARS = 500
# HTTP paths polled by probes and scrapers: not logged.
QUIET_PATHS = frozenset(("/health", "/metrics"))
# gRPC status codes that are the client's doing (or its choice) rather than the server's.
_CLIENT_CODES = frozenset(("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "NOT_FOUND", "ALREADY_EXISTS",
                           "PERMISSION_DENIED", "UNAUTHENTICATED", "FAILED_PRECONDITION",
                           "OUT_OF_RANGE", "ABORTED"))
_ERROR_CODES = frozenset(("INTERNAL", "UNKNOWN", "DATA_LOSS"))
_current: ContextVar[Record | None] = ContextVar("llmserve_access_record", default=None)


def configure(enabled: bool) -> None:
    """--disable-log-requests (enabled False): only failures (WARNING and above) are logged."""
    log.setLevel(logging.NOTSET if enabled else logging.WARNING)


class Record:
    """One request's access-log fields, filled as it runs; emit() writes the line."""

    __slots__ = ("door", "method", "start", "request_id", "prompt_tokens", "output_tokens",
                 "first", "status", "message", "param", "error_id", "exc_info", "unfinished")

    def __init__(self, door: str, method: str):
        self.door, self.method = door, method
        self.start = time.monotonic()
        self.request_id = None
        self.prompt_tokens = self.output_tokens = None
        self.first = None  # when the first output token came (time.monotonic)
        self.status = None  # a gRPC status code's name, or an HTTP status (int)
        self.message = self.param = self.error_id = self.exc_info = None
        self.unfinished = False  # an HTTP stream that has not reached its end

    def admitted(self, request_id: str, num_prompt_tokens: int) -> None:
        self.request_id, self.prompt_tokens, self.output_tokens = request_id, num_prompt_tokens, 0

    def add_output(self, num_tokens: int) -> None:
        """Tokens sent to the client (called per message, not per token)."""
        if num_tokens:
            if self.first is None:
                self.first = time.monotonic()
            self.output_tokens = (self.output_tokens or 0) + num_tokens

    def answered(self, status, message: str | None, param: str | None = None) -> None:
        """The status (and error text) the call ended with; an internal error's real message,
        noted by internal_error, stays."""
        self.status = status
        if self.error_id is None:
            self.message, self.param = message, param

    def outcome(self) -> tuple[str, int]:
        """(ok | refused | cancelled | failed, log level)."""
        s = self.status
        if isinstance(s, int):
            if self.unfinished or s == 499:
                return "cancelled", logging.INFO
            if s < 400:
                return "ok", logging.INFO
            if s < 500:
                return "refused", logging.INFO
            return "failed", logging.WARNING if s in (502, 503, 504) and not self.error_id else logging.ERROR
        if s == "OK":
            return "ok", logging.INFO
        if s == "CANCELLED" or s is None:
            return "cancelled", logging.INFO
        if s in _CLIENT_CODES:
            return "refused", logging.INFO
        return "failed", logging.ERROR if s in _ERROR_CODES or self.error_id else logging.WARNING

    def emit(self) -> None:
        outcome, level = self.outcome()
        if not log.isEnabledFor(level):
            return
        now = time.monotonic()
        fields = [("door", self.door), ("method", self.method), ("request_id", self.request_id),
                  ("status", "CANCELLED" if self.status is None else self.status),
                  ("outcome", outcome), ("prompt_tokens", self.prompt_tokens),
                  ("output_tokens", self.output_tokens),
                  ("ttft_ms", None if self.first is None else round(1e3 * (self.first - self.start), 1)),
                  ("duration_ms", round(1e3 * (now - self.start), 1))]
        if self.error_id is not None:
            fields.append(("error_id", self.error_id))
        if self.param is not None:
            fields.append(("param", self.param))
        if self.message is not None and outcome != "ok":
            fields.append(("message", self.message[:MAX_MESSAGE_CHARS]))
        log.log(level, "%s", format_fields(fields), exc_info=self.exc_info)


def begin(door: str, method: str) -> Record:
    """A new request's record, current in this task (and the tasks it starts)."""
    record = Record(door, method)
    _current.set(record)
    return record


def current() -> Record:
    """The running request's record (a detached one outside any door's hook: tests)."""
    return _current.get() or Record("-", "-")


_ERROR_ID = re.compile(r"^internal error \(error id ([0-9a-f]{6,32})\)$")


def error_id_for(message: str) -> str:
    """The error id of an INTERNAL error: the one its message already carries (the engine core
    logged the real text under it), else a new one."""
    m = _ERROR_ID.match(message)
    return m.group(1) if m else uuid.uuid4().hex[:12]


def internal_error(error_id: str, message: str, exc_info: bool = False) -> None:
    """An internal failure whose client got only `error_id`: the real message (and the traceback
    with exc_info) goes on the request's access line at ERROR, or its own line outside one."""
    record = _current.get()
    if record is None:
        logging.getLogger("llmserve.api").error("request failed (error id %s): %s", error_id, message,
                                                exc_info=exc_info)
        return
    record.error_id, record.message = error_id, message
    if exc_info:
        record.exc_info = sys.exc_info()


def format_fields(fields) -> str:
    """key=value pairs (logfmt): - for None, JSON-quoted when a value has spaces or quotes."""
    out = []
    for key, value in fields:
        text = "-" if value is None else str(value)
        if not text or any(c in text for c in ' "=\\\n\t'):
            text = json.dumps(text, ensure_ascii=False)
        out.append(f"{key}={text}")
    return " ".join(out)


_PAIR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


def parse_line(text: str) -> dict[str, str]:
    """The fields of an access line (what format_fields wrote; tests and log tooling)."""
    return {k: json.loads(v) if v.startswith('"') else v for k, v in _PAIR.findall(text)}


class HttpAccessLog:
    """Pure ASGI, around the whole HTTP app (its guard included): each request's record, its
    status from the response's start, an error body's message and param; the line when the
    response is done. /health and /metrics are not logged."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in QUIET_PATHS:
            return await self.app(scope, receive, send)
        record = begin("http", f"{scope['method']} {scope['path']}")
        error_body: list[bytes] | None = None
        complete = False

        async def send_(message):
            nonlocal error_body, complete
            if message["type"] == "http.response.start":
                record.status = message["status"]
                if record.status >= 400:
                    error_body = []
            elif message["type"] == "http.response.body":
                if error_body is not None:
                    error_body.append(message.get("body", b""))
                complete = not message.get("more_body", False)
            await send(message)

        try:
            await self.app(scope, receive, send_)
        except Exception:
            if record.status is None:  # nothing was answered: the server's default 500 follows
                record.answered(500, "unhandled exception")
                record.exc_info = sys.exc_info()
            if not complete:
                raise
            # Answered in full (the app's 500 handler, which noted the error id and traceback,
            # re-raises for the server to log): the access line is the one log of it.
        finally:
            if error_body and record.message is None and record.error_id is None:
                record.message, record.param = _error_fields(b"".join(error_body))
            record.emit()


def _error_fields(body: bytes) -> tuple[str | None, str | None]:
    """An OpenAI-shaped error body's message and param."""
    try:
        error = json.loads(body)["error"]
        return error.get("message"), error.get("param")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, None
