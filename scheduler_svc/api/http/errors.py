"""Errors of the HTTP API in OpenAI's shape: {"error": {"message", "type", "param", "code"}},
with the HTTP status that matches the API's RequestError codes."""

from __future__ import annotations

import uuid

from pydantic import ValidationError
from starlette.responses import JSONResponse

from scheduler_svc.api import access_log
from scheduler_svc.api.admission import is_overload
from scheduler_svc.api.http.schemas import UNSUPPORTED
from scheduler_svc.messages import RequestError

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
          413: "invalid_request_error", 429: "rate_limit_error", 500: "internal_error",
          503: "service_unavailable"}


class HttpError(Exception):
    """An error answered as is (status, message, param, code)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def status_of(e: RequestError) -> int:
    if e.code == "INVALID_ARGUMENT":
        return 400
    if e.code == "RESOURCE_EXHAUSTED":  # load (retry later) or a request too big to ever fit
        return 429 if is_overload(e) else 400
    if e.code == "UNAVAILABLE":
        return 503
    return 500


def request_error_body(e: RequestError) -> tuple[int, dict]:
    status = status_of(e)
    if status == 500:  # its text is internal (e.g. the executor's exception)
        error_id = access_log.error_id_for(e.message)  # the core's own id, if it gave one
        access_log.internal_error(error_id, e.message)  # on the request's access line
        return status, error_body(status, f"internal error (error id {error_id})")
    return status, error_body(status, e.message, e.param, e.code.lower())


def from_request_error(e: RequestError) -> JSONResponse:
    status, body = request_error_body(e)
    return JSONResponse(body, status_code=status)


def from_validation_error(e: ValidationError) -> JSONResponse:
    """A body that is not JSON or does not fit the schema: 400, naming the field."""
    errors = e.errors(include_url=False)
    first = errors[0] if errors else {"loc": (), "msg": str(e)}
    loc = ".".join(str(x) for x in _client_path(first.get("loc", ())))
    if first.get("type") == "json_invalid":
        return error_response(400, f"the body is not valid JSON: {first['msg']}")
    if first.get("type") == "extra_forbidden":
        return error_response(400, _unknown_field_message(loc), loc, "unsupported_field")
    message = f"{loc}: {first['msg']}" if loc else first["msg"]
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more errors)"
    return error_response(400, message, loc or None)


def _client_path(loc: tuple) -> list:
    """pydantic's location as the client's body spells it: keys and indexes only, without the
    union branches pydantic names in between ("prompt.str", "messages.0.content.list[...]")."""
    return [x for x in loc if isinstance(x, int) or not _is_branch(x)]


def _is_branch(name: str) -> bool:
    # our fields are snake_case; branches are type names: str, int, list[int], ContentPart, ...
    return "[" in name or name[:1].isupper() or name in ("str", "int", "float", "bool", "none", "list", "dict")


def _unknown_field_message(loc: str) -> str:
    name = loc.rsplit(".", 1)[-1]
    if name in UNSUPPORTED:
        return (f"{loc}: {UNSUPPORTED[name]} ('{name}') is not supported by this server yet; "
                "remove the field (it is refused, not ignored, because it would change the output)")
    return (f"{loc}: this server does not know the field '{name}'; remove it (unknown fields are "
            "refused, not ignored, because they might change the output)")


def internal_error_response() -> JSONResponse:
    error_id = uuid.uuid4().hex[:12]
    access_log.internal_error(error_id, "the route raised", exc_info=True)  # with the traceback
    return error_response(500, f"internal error (error id {error_id})")
