"""OpenAI's Responses API, POST /v1/responses, on the chat completions' machinery: the request
is checked (refuse.py), translated into the chat completion it is (translate.py) and admitted
as one (tools, structured outputs, the one validation of sampling parameters); its outputs
become output items (output.py) and a response object or a stream of events (job.py). Nothing
is stored: GET, DELETE and cancel of /v1/responses/{id} answer 404 saying so."""

from __future__ import annotations

import uuid

from fastapi import FastAPI, Request
from starlette.responses import Response, StreamingResponse

from scheduler_svc.api import access_log
from scheduler_svc.api.http import errors
from scheduler_svc.api.http.context import HttpContext, parse
from scheduler_svc.api.http.fanout import admit_prompts
from scheduler_svc.api.http.generate import collected
from scheduler_svc.api.http.responses.job import ResponseJob
from scheduler_svc.api.http.responses.refuse import LOGPROBS, NO_STATE, check_refused
from scheduler_svc.api.http.responses.schemas import ResponsesRequest
from scheduler_svc.api.http.responses.translate import to_chat
from scheduler_svc.api.tools.plan import prepare_chat
from scheduler_svc.api.validation import invalid
from scheduler_svc.messages import RequestError


def add_routes(app: FastAPI, ctx: HttpContext) -> None:
    @app.post("/v1/responses")
    async def create_response(request: Request):
        return await _create(ctx, request, await parse(request, ResponsesRequest))

    async def not_stored(response_id: str):
        raise errors.HttpError(404, f"no response {response_id[:80]!r}: {NO_STATE}", "response_id",
                               "not_found")

    for path, methods in (("/v1/responses/{response_id}", ["GET", "DELETE"]),
                          ("/v1/responses/{response_id}/cancel", ["POST"]),
                          ("/v1/responses/{response_id}/input_items", ["GET"])):
        app.add_api_route(path, not_stored, methods=methods)


async def _create(ctx: HttpContext, request: Request, body: ResponsesRequest) -> Response:
    record = access_log.current()
    record.request_id = "resp_" + uuid.uuid4().hex
    ctx.check_model(body.model)
    limit = ctx.admission.sizes.max_chat_messages  # before any loop over the items
    if isinstance(body.input, list) and len(body.input) > limit:
        raise invalid(f"input has {len(body.input)} items; the limit is {limit} (--max-chat-messages)", "input")
    check_refused(body)
    translated = to_chat(body)
    logprobs = LOGPROBS in (body.include or ())
    try:
        prompt, raw, plan = prepare_chat(translated.chat, ctx.tools, ctx.admission.sizes)
        if logprobs and plan is not None and plan.choice != "none":
            raise invalid(f"{LOGPROBS} is not available with tools the model may call (tool_choice "
                          "none shows the tools without parsing calls)", "include")
        (admitted,) = await admit_prompts(ctx.admission, [prompt], raw)
    except RequestError as e:  # the chat's fields named as the client spelled them
        e.param, e.message = translated.client_param(e.param), translated.client_message(e.message)
        raise
    record.admitted(record.request_id, len(admitted[0]))
    job = ResponseJob(ctx, body, admitted, record, plan, logprobs)
    if body.stream:
        record.unfinished = True  # until the engine's iterator ends: else the client left
        return StreamingResponse(job.events(), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache"})
    return await collected(request, job.collect())
