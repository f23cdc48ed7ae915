"""The OpenAI-compatible HTTP API (FastAPI) on the API process's engine: the same admission
(validation, tokenize pool, chat templates) as the gRPC servicer, errors in OpenAI's shape.

Guard (pure ASGI, before any route): the body size limit, read before parsing, and the API key
(`Authorization: Bearer <key>`, or Anthropic's `x-api-key: <key>`; every path but /health and
/metrics)."""

from __future__ import annotations

import hmac
import time

from fastapi import FastAPI, Request
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from scheduler_svc.api import access_log, memory
from scheduler_svc.api.http import errors, generate, messages, metrics_route, responses, tokenizer_info
from scheduler_svc.api.http.context import HttpContext, parse
from scheduler_svc.api.http.schemas import DetokenizeRequest, TokenizeRequest
from scheduler_svc.api.validation import check_detokenize_ids, check_prompt_size, invalid
from scheduler_svc.messages import RequestError

OPEN_PATHS = ("/health", "/metrics")


class Guard:
    """Body limit and API key, in front of the app."""

    def __init__(self, app, max_body_bytes: int, api_key: str):
        self.app, self.max_body_bytes = app, max_body_bytes
        self._expected = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if self._expected and not scope["path"].startswith(OPEN_PATHS):
            given = headers.get(b"authorization", b"")
            anthropic = b"Bearer " + headers.get(b"x-api-key", b"")  # (the Anthropic clients' header)
            if not (hmac.compare_digest(given, self._expected) or hmac.compare_digest(anthropic, self._expected)):
                return await errors.error_response(
                    401, "a valid API key is required: send the header 'Authorization: Bearer "
                    "<api key>' (or 'x-api-key: <api key>')", code="invalid_api_key",
                    headers={"www-authenticate": "Bearer"})(scope, receive, send)
        too_large = errors.error_response(
            413, f"the request body exceeds {self.max_body_bytes} bytes", code="body_too_large")
        try:
            declared = int(headers.get(b"content-length", b"0"))
        except ValueError:
            declared = 0
        if declared > self.max_body_bytes:
            return await too_large(scope, receive, send)
        chunks, size = [], 0
        while True:  # the whole body, bounded, before any parsing
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                chunks.clear()
                await too_large(scope, receive, send)
                return memory.release_after(size)
            if not message.get("more_body"):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # then the real one: disconnects are seen

        try:
            await self.app(scope, replay, send)
        finally:
            chunks.clear()
            memory.release_after(size)


def build_app(ctx: HttpContext, max_body_bytes: int) -> access_log.HttpAccessLog:
    # no slash redirects: a 307 with an empty body is no OpenAI error (POST /v1/completions/ is a 404)
    app = FastAPI(title="llmserve OpenAI-compatible API", docs_url=None, redoc_url=None,
                  openapi_url=None, redirect_slashes=False)
    app.state.ctx = ctx

    @app.exception_handler(RequestError)
    async def _request_error(request, e: RequestError):
        return errors.from_request_error(e)

    @app.exception_handler(ValidationError)
    async def _validation_error(request, e: ValidationError):
        return errors.from_validation_error(e)

    @app.exception_handler(errors.HttpError)
    async def _http_error(request, e: errors.HttpError):
        return errors.error_response(e.status, e.message, e.param, e.code)

    @app.exception_handler(Exception)
    async def _internal(request, e: Exception):
        return errors.internal_error_response()

    @app.exception_handler(StarletteHTTPException)
    async def _no_route(request, e: StarletteHTTPException):  # 404, 405: in OpenAI's shape too
        if e.status_code == 404:
            message = (f"{request.method} {request.url.path} is not a route of this server (it "
                       "serves /v1/completions, /v1/chat/completions, /v1/responses, /v1/messages, /v1/models, /tokenize, "
                       "/detokenize, /health and /metrics)")
        else:
            message = f"{request.method} {request.url.path}: {e.detail}"
        return errors.error_response(e.status_code, message, code="not_found" if e.status_code == 404
                                     else None, headers=getattr(e, "headers", None))

    @app.get("/health")
    async def health():
        engine = ctx.engine
        if engine.stats.executor_available and not engine.core_lost.is_set():
            return Response(status_code=200)
        return errors.error_response(503, "the executor is unavailable")

    @app.get("/metrics")
    async def metrics():
        return Response(metrics_route.metrics_text(ctx.metrics), media_type=metrics_route.CONTENT_TYPE)

    def model_card() -> dict:
        return {"id": ctx.model_name, "object": "model", "created": int(time.time()),
                "owned_by": "llmserve", "root": ctx.model_name,
                "max_model_len": ctx.admission.limits.max_model_len}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        ctx.check_model(model_id)
        return model_card()

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await parse(request, TokenizeRequest)
        ctx.check_model(body.model)
        prompt = body.to_prompt()
        limits = ctx.admission.limits
        check_prompt_size(prompt, ctx.admission.sizes, limits)
        encoded = await ctx.admission.pool.encode(prompt, limits.max_model_len,
                                                  with_tokens=body.return_token_strs)
        if encoded.num_tokens > limits.max_model_len:
            raise invalid(f"the input has {encoded.num_tokens} tokens; /tokenize answers up to "
                          f"the model's context of {limits.max_model_len} tokens")
        answer = {"count": encoded.num_tokens, "max_model_len": limits.max_model_len,
                  "tokens": encoded.token_ids}
        if body.return_token_strs:
            answer["token_strs"] = encoded.tokens
        return answer

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await parse(request, DetokenizeRequest)
        ctx.check_model(body.model)
        try:
            token_ids = check_detokenize_ids(body.tokens, ctx.admission.limits)
        except RequestError as e:
            e.param = "tokens"  # as this body names them
            raise
        return {"prompt": await ctx.admission.pool.decode(token_ids, body.skip_special_tokens)}

    generate.add_routes(app, ctx)
    responses.add_routes(app, ctx)  # /v1/responses (responses/)
    messages.add_routes(app, ctx)  # /v1/messages (messages/: Anthropic's shapes, its errors too)
    if ctx.enable_tokenizer_info_endpoint:
        tokenizer_info.add_route(app, ctx.tokenizer)
    # the access log outermost: the guard's refusals (401, 413) get their line too
    return access_log.HttpAccessLog(messages.AnthropicErrors(Guard(app, max_body_bytes, ctx.api_key)))

