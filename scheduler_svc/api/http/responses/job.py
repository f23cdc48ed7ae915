"""One admitted Responses request: the engine's outputs through the tool-call parser (when the
request has tools) into output items (output.py), collected into one response object or
streamed as OpenAI's semantic events, each `event: <type>` with `data` carrying the type and a
`sequence_number` counting from 0: `response.created`, `response.in_progress`, the items' events,
then `response.completed` or `response.incomplete` (cut by max_output_tokens or the context)
with the whole response. An error of the engine after the stream began ends it with
`response.failed` (the response, status `failed`, its `error`). Leaving the engine's iterator
aborts the request: a stream is cancelled when its client goes (as chat's are). A finished
response (completed or incomplete, collected or streamed to its end) is given to `keep`
(stored.keeper) when it is to be kept; a failed or cancelled one never is."""

from __future__ import annotations

import json
import time
from contextlib import aclosing

from scheduler_svc.api import access_log
from scheduler_svc.api.http import errors
from scheduler_svc.api.http.echo import token_logprobs
from scheduler_svc.api.http.responses.output import OutputItems
from scheduler_svc.api.http.responses.schemas import FunctionChoice, ResponsesRequest
from scheduler_svc.api.tools.events import Content
from scheduler_svc.core.request import FinishReason
from scheduler_svc.messages import RequestError

_ERROR_CODES = {400: "invalid_prompt", 429: "rate_limit_exceeded"}  # else server_error


class ResponseJob:
    def __init__(self, ctx, body: ResponsesRequest, admitted: tuple, record: access_log.Record,
                 plan=None, logprobs: bool = False, keep=None):
        self.ctx, self.body, self.record = ctx, body, record
        self.prompt_ids, self.params = admitted
        self.id, self.created_at = record.request_id, int(time.time())
        self.parser = plan.new_parser() if plan is not None else None  # None: all is content
        self.output = OutputItems(plan.parallel if plan is not None else True)
        self.logprobs = logprobs
        self.keep = keep  # keep(response) once finished; None: not kept (store false, storing off)
        self.finish_reason: FinishReason | None = None
        self.num_output_tokens = 0
        self._seq = 0

    # ------------------------------------------------------------ the response object

    def response(self, status: str, error: dict | None = None) -> dict:
        body = self.body
        fmt = body.text.format if body.text is not None and body.text.format is not None else None
        choice = body.tool_choice
        done = status not in ("in_progress", "failed")
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "background": False, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "max_tool_calls": None, "model": self.ctx.model_name,
            "output": self.output.items if status != "in_progress" else [],
            "parallel_tool_calls": body.parallel_tool_calls is not False, "previous_response_id": body.previous_response_id,
            "reasoning": {"effort": None, "summary": None}, "store": self.keep is not None,
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"},
                     "verbosity": "medium"},
            "tool_choice": choice.model_dump() if isinstance(choice, FunctionChoice) else choice or "auto",
            "tools": [t.model_dump() for t in body.tools or ()],
            "top_logprobs": body.top_logprobs or 0, "top_p": 1.0 if body.top_p is None else body.top_p,
            "truncation": "disabled", "user": body.user, "metadata": body.metadata or {},
            "usage": self._usage() if done else None,
        }

    def _usage(self) -> dict:
        num_input = len(self.prompt_ids)
        return {"input_tokens": num_input, "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": self.num_output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": num_input + self.num_output_tokens}

    # ------------------------------------------------------------ the engine's outputs

    def _add(self, out) -> list[dict]:
        """One engine output's stream events (after its tokens went into the output items)."""
        self.record.add_output(len(out.new_token_ids))
        text, finished = out.new_text, out.finish_reason is not None
        if self.parser is None:
            events = [Content(text)] if text else []
        else:
            events = (self.parser.feed(text) if text else []) + (self.parser.finish() if finished else [])
        if finished:
            self.finish_reason, self.num_output_tokens = out.finish_reason, out.num_output_tokens
        logprobs = token_logprobs(self.ctx.token_text, out.logprobs) if self.logprobs and out.logprobs else None
        return self.output.add(events, logprobs)

    def _status(self) -> str:
        return "incomplete" if self.finish_reason in (FinishReason.LENGTH, FinishReason.CANCELLED) else "completed"

    async def collect(self) -> dict:
        """The whole response; the engine's iterator is closed (the request aborted) when this
        is cancelled."""
        async with aclosing(self.ctx.engine.generate(self.prompt_ids, self.params)) as outs:
            async for out in outs:
                self._add(out)
        self.output.finish(self._status())
        return self._finished()

    def _finished(self) -> dict:
        """The finished response (its output closed), kept when it is to be."""
        status = self._status()
        response = self.response(status)
        if self.keep is not None:
            self.keep(response)
        return response

    def _sse(self, event: dict) -> str:
        event["sequence_number"], self._seq = self._seq, self._seq + 1
        return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"

    async def events(self):
        """The server-sent events; cancelled when the client goes (the request is aborted)."""
        record = self.record
        yield self._sse({"type": "response.created", "response": self.response("in_progress")})
        yield self._sse({"type": "response.in_progress", "response": self.response("in_progress")})
        try:
            async with aclosing(self.ctx.engine.generate(self.prompt_ids, self.params)) as outs:
                async for out in outs:
                    events = self._add(out)
                    if events:
                        yield "".join(self._sse(e) for e in events)
            last = "".join(self._sse(e) for e in self.output.finish(self._status()))
            record.unfinished = False
            response = self._finished()
            yield last + self._sse({"type": f"response.{response['status']}", "response": response})
        except RequestError as e:
            status, error = errors.request_error_body(e)  # an internal one notes its error id
            record.unfinished = False
            record.answered(status, error["error"]["message"], error["error"]["param"])
            failed = {"code": _ERROR_CODES.get(status, "server_error"), "message": error["error"]["message"]}
            yield self._sse({"type": "response.failed", "response": self.response("failed", failed)})
