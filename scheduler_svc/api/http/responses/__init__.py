"""OpenAI's Responses API, POST /v1/responses, on the chat completions' machinery: the request
is checked (refuse.py), translated into the chat completion it is (translate.py) and admitted
as one (tools, structured outputs, the one validation of sampling parameters); its outputs
become output items (output.py) and a response object or a stream of events (job.py). A
finished response is kept (store.py, one ResponseStore per app, bounded) unless the request says
`store: false`; `previous_response_id` continues a kept one, and GET/DELETE of /v1/responses/{id}
read and drop it (stored.py)."""

from __future__ import annotations

import uuid

from fastapi import FastAPI, Request
from starlette.responses import Response, StreamingResponse

from scheduler_svc.api import access_log
from scheduler_svc.api.http.context import HttpContext, parse
from scheduler_svc.api.http.fanout import admit_prompts
from scheduler_svc.api.http.generate import collected
from scheduler_svc.api.http.responses.job import ResponseJob
from scheduler_svc.api.http.responses import stored
from scheduler_svc.api.http.responses.refuse import LOGPROBS, check_refused
from scheduler_svc.api.http.responses.schemas import ResponsesRequest
from scheduler_svc.api.http.responses.store import ResponseStore
from scheduler_svc.api.http.responses.translate import to_chat
from scheduler_svc.api.tools.plan import prepare_chat
from scheduler_svc.api.validation import invalid
from scheduler_svc.messages import RequestError


def add_routes(app: FastAPI, ctx: HttpContext) -> None:
    store = ResponseStore(ctx.responses_store_max_entries, ctx.responses_store_max_bytes)
    app.state.response_store = store  # the one; written only here (on the event loop)

    @app.post("/v1/responses")
    async def create_response(request: Request):
        return await _create(ctx, store, request, await parse(request, ResponsesRequest))

    stored.add_stored_routes(app, store)


def _check_count(body: ResponsesRequest, before, limit: int) -> None:
    """The items of the input, and of the conversation it continues, within --max-chat-messages."""
    num_own = len(body.input) if isinstance(body.input, list) else 1
    num_before = before.num_items if before is not None else 0
    if num_before + num_own > limit:
        raise invalid(f"the conversation of previous_response_id has {num_before} items and input "
                      f"{num_own}: {num_before + num_own} in all; the limit is {limit} (--max-chat-messages)",
                      "previous_response_id" if num_before >= limit else "input")


async def _create(ctx: HttpContext, store: ResponseStore, request: Request, body: ResponsesRequest) -> Response:
    record = access_log.current()
    record.request_id = "resp_" + uuid.uuid4().hex
    ctx.check_model(body.model)
    limit = ctx.admission.sizes.max_chat_messages  # before any loop over the items
    if isinstance(body.input, list) and len(body.input) > limit:
        raise invalid(f"input has {len(body.input)} items; the limit is {limit} (--max-chat-messages)", "input")
    check_refused(body)
    before = stored.previous(store, body)
    _check_count(body, before, limit)
    translated = to_chat(body, stored.conversation(before) if before is not None else ())
    logprobs = LOGPROBS in (body.include or ())
    try:
        prompt, raw, plan = prepare_chat(translated.chat, ctx.tools, ctx.admission.sizes)
        if logprobs and plan is not None and plan.choice != "none":
            raise invalid(f"{LOGPROBS} is not available with tools the model may call (tool_choice "
                          "none shows the tools without parsing calls)", "include")
        (admitted,) = await admit_prompts(ctx.admission, [prompt], raw)
    except RequestError as e:  # the chat's fields named as the client spelled them
        e.param, e.message = translated.client_param(e.param), translated.client_message(e.message)
        if before is not None and e.param == "input":
            e.message += (f" (the input after the {before.num_items} items of the conversation "
                          "of previous_response_id)")
        raise
    record.admitted(record.request_id, len(admitted[0]))
    job = ResponseJob(ctx, body, admitted, record, plan, logprobs, stored.keeper(store, body, before))
    if body.stream:
        record.unfinished = True  # until the engine's iterator ends: else the client left
        return StreamingResponse(job.events(), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache"})
    return await collected(request, job.collect())
