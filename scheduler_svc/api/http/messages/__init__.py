"""Anthropic's Messages API, POST /v1/messages and /v1/messages/count_tokens, on the chat
completions' machinery: the request is checked (refuse.py), translated into the chat completion
it is (translate.py) and admitted as one (tools, structured outputs, the one validation of
sampling parameters); its outputs become content blocks (content.py) and a message or a stream
of Anthropic's events (job.py). count_tokens renders and tokenizes the same prompt, so it
answers what the message's usage.input_tokens reports. Errors on these paths are answered in
Anthropic's shape (errors.py: AnthropicErrors, in front of the app)."""

from __future__ import annotations

import uuid

from fastapi import FastAPI, Request
from starlette.responses import Response, StreamingResponse

from scheduler_svc.api import access_log
from scheduler_svc.api.http.context import HttpContext, parse
from scheduler_svc.api.http.fanout import admit_prompts
from scheduler_svc.api.http.generate import collected
from scheduler_svc.api.http.messages.errors import AnthropicErrors
from scheduler_svc.api.http.messages.job import MessageJob
from scheduler_svc.api.http.messages.refuse import check_refused
from scheduler_svc.api.http.messages.schemas import CountTokensRequest, MessagesRequest, _Prompt
from scheduler_svc.api.http.messages.translate import ChatOfMessages, to_chat
from scheduler_svc.api.tools.plan import prepare_chat
from scheduler_svc.api.validation import check_prompt_size
from scheduler_svc.messages import RequestError

__all__ = ["AnthropicErrors", "add_routes"]


def add_routes(app: FastAPI, ctx: HttpContext) -> None:
    @app.post("/v1/messages")
    async def create_message(request: Request):
        return await _create(ctx, request, await parse(request, MessagesRequest))

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        body = await parse(request, CountTokensRequest)
        prompt, _, _, translated = _prepare(ctx, body)
        admission = ctx.admission
        try:
            check_prompt_size(prompt, admission.sizes, admission.limits)
            prompt_ids = await admission.prompt_ids(prompt)
        except RequestError as e:
            _name_fields(e, translated)
            raise
        return {"input_tokens": len(prompt_ids)}


def _name_fields(e: RequestError, translated: ChatOfMessages) -> None:
    """A refusal of the chat's admission, its fields named as the Messages request spells them."""
    e.param, e.message = translated.client_param(e.param), translated.client_message(e.message)


def _prepare(ctx: HttpContext, body: _Prompt):
    """(prompt, raw params, ToolPlan or None, the translation) of a checked request."""
    ctx.check_model(body.model)
    check_refused(body, ctx.admission.sizes.max_chat_messages)
    translated = to_chat(body)
    try:
        return (*prepare_chat(translated.chat, ctx.tools, ctx.admission.sizes), translated)
    except RequestError as e:
        _name_fields(e, translated)
        raise


async def _create(ctx: HttpContext, request: Request, body: MessagesRequest) -> Response:
    record = access_log.current()
    record.request_id = "msg_" + uuid.uuid4().hex
    prompt, raw, plan, translated = _prepare(ctx, body)
    try:
        (admitted,) = await admit_prompts(ctx.admission, [prompt], raw)
    except RequestError as e:
        _name_fields(e, translated)
        raise
    record.admitted(record.request_id, len(admitted[0]))
    job = MessageJob(ctx, admitted, record, plan, body.stop_sequences or [])
    if body.stream:
        record.unfinished = True  # until the engine's iterator ends: else the client left
        return StreamingResponse(job.events(), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache"})
    return await collected(request, job.collect())
