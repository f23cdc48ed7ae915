"""One admitted Messages request: the engine's outputs through the tool-call parser (when the
request has tools) into content blocks (content.py), collected into one message or streamed as
Anthropic's server-sent events, each `event: <type>` with `data` carrying the type:
`message_start` (the message, no content, stop_reason null), `ping`, the blocks' events, then
`message_delta` (stop_reason, stop_sequence, usage) and `message_stop`. An error of the engine
after the stream began ends it with an `error` event in Anthropic's error shape. Leaving the
engine's iterator aborts the request: a stream is cancelled when its client goes (as chat's
are)."""

from __future__ import annotations

import json
from contextlib import aclosing

from scheduler_svc.api import access_log
from scheduler_svc.api.http import errors
from scheduler_svc.api.http.messages.content import ContentBlocks
from scheduler_svc.api.http.messages.errors import anthropic_error
from scheduler_svc.api.tools.events import Content
from scheduler_svc.core.request import FinishReason
from scheduler_svc.messages import RequestError


class MessageJob:
    def __init__(self, ctx, admitted: tuple, record: access_log.Record, plan, stop_sequences: list[str]):
        self.ctx, self.record = ctx, record
        self.prompt_ids, self.params = admitted
        self.id = record.request_id
        self.parser = plan.new_parser() if plan is not None else None  # None: all is content
        self.content = ContentBlocks(plan.parallel if plan is not None else True)
        self.stop_sequences = stop_sequences
        self.finish_reason: FinishReason | None = None
        self.matched_stop = ""
        self.num_output_tokens = 0

    def message(self, done: bool = True) -> dict:
        stop_reason, stop_sequence = self._stop() if done else (None, None)
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.ctx.model_name,
                "content": self.content.blocks if done else [], "stop_reason": stop_reason,
                "stop_sequence": stop_sequence, "usage": self._usage()}

    def _usage(self) -> dict:
        # input_tokens counts the whole prompt (as count_tokens does): the automatic prefix
        # cache's hits are not told apart, so the cache fields are 0
        return {"input_tokens": len(self.prompt_ids), "output_tokens": self.num_output_tokens,
                "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "service_tier": "standard"}

    def _stop(self) -> tuple[str, str | None]:
        if self.finish_reason in (FinishReason.LENGTH, FinishReason.CANCELLED):
            return "max_tokens", None
        if self.content.called:
            return "tool_use", None
        if self.finish_reason == FinishReason.STOP and self.matched_stop in self.stop_sequences:
            return "stop_sequence", self.matched_stop
        return "end_turn", None

    def _add(self, out) -> list[dict]:
        """One engine output's stream events (after its text went into the content blocks)."""
        self.record.add_output(len(out.new_token_ids))
        text, finished = out.new_text, out.finish_reason is not None
        if self.parser is None:
            events = self.content.add([Content(text)] if text else [])
        else:
            events = self.content.add((self.parser.feed(text) if text else []) +
                                      (self.parser.finish() if finished else []))
        if finished:
            self.finish_reason, self.matched_stop = out.finish_reason, out.matched_stop
            self.num_output_tokens = out.num_output_tokens
        return events

    async def collect(self) -> dict:
        """The whole message; the engine's iterator is closed (the request aborted) when this
        is cancelled."""
        async with aclosing(self.ctx.engine.generate(self.prompt_ids, self.params)) as outs:
            async for out in outs:
                self._add(out)
        self.content.finish()
        return self.message()

    async def events(self):
        """The server-sent events; cancelled when the client goes (the request is aborted)."""
        record = self.record
        yield _sse({"type": "message_start", "message": self.message(done=False)}) + _sse({"type": "ping"})
        try:
            async with aclosing(self.ctx.engine.generate(self.prompt_ids, self.params)) as outs:
                async for out in outs:
                    events = self._add(out)
                    if events:
                        yield "".join(_sse(e) for e in events)
            last = "".join(_sse(e) for e in self.content.finish())
            stop_reason, stop_sequence = self._stop()
            usage = self._usage()
            record.unfinished = False
            yield last + _sse({"type": "message_delta", "delta": {"stop_reason": stop_reason,
                                                                  "stop_sequence": stop_sequence},
                               "usage": {"input_tokens": usage["input_tokens"],
                                         "output_tokens": usage["output_tokens"]}}) + \
                _sse({"type": "message_stop"})
        except RequestError as e:
            status, error = errors.request_error_body(e)  # an internal one notes its error id
            record.unfinished = False
            record.answered(status, error["error"]["message"], error["error"]["param"])
            yield _sse(anthropic_error(status, error["error"]["message"], error["error"]["param"]))


def _sse(event: dict) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
