"""POST /v1/completions and /v1/chat/completions: admitted like gRPC requests, then streamed as
server-sent events or collected into one response. Leaving the engine's iterator aborts the
request (its KV blocks are freed): a stream is cancelled when its client goes; a collecting
request watches request.is_disconnected()."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import aclosing

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from scheduler_svc.api import access_log
from scheduler_svc.api.http import errors
from scheduler_svc.api.http.context import HttpContext, parse
from scheduler_svc.api.http.schemas import ChatCompletionRequest, CompletionRequest
from scheduler_svc.core.request import FinishReason
from scheduler_svc.messages import RequestError

DISCONNECT_POLL_S = 0.25
_FINISH = {FinishReason.LENGTH: "length", FinishReason.STOP: "stop", FinishReason.EOS: "stop",
           FinishReason.CANCELLED: "abort"}


def add_routes(app: FastAPI, ctx: HttpContext) -> None:
    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _generate(ctx, request, await parse(request, CompletionRequest), chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _generate(ctx, request, await parse(request, ChatCompletionRequest), chat=True)


async def _generate(ctx: HttpContext, request: Request, body, chat: bool) -> Response:
    record = access_log.current()  # the request's access-log line (access_log.HttpAccessLog)
    record.request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    ctx.check_model(body.model)
    try:
        prompt, raw = body.to_prompt(), body.to_raw()
        prompt_ids, params = await ctx.admission.admit(prompt, raw, "")
    except RequestError as e:
        e.param = body.client_param(e.param)  # as the client spelled it
        raise
    record.admitted(record.request_id, len(prompt_ids))
    job = _Job(ctx, body, chat, prompt_ids, params, record)
    if body.stream:
        record.unfinished = True  # until the engine's iterator ends: else the client left
        return StreamingResponse(job.events(), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache"})
    task = asyncio.create_task(job.collect())
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if not task.done() and await request.is_disconnected():
                task.cancel()  # leaves the engine's iterator: the request is aborted
                await asyncio.gather(task, return_exceptions=True)
                return Response(status_code=499)
    finally:
        if not task.done():
            task.cancel()
    return JSONResponse(task.result())


class _Job:
    """One admitted request and its responses in OpenAI's shapes."""

    def __init__(self, ctx: HttpContext, body, chat: bool, prompt_ids: list[int], params,
                 record: access_log.Record):
        self.ctx, self.body, self.chat = ctx, body, chat
        self.prompt_ids, self.params, self.n = prompt_ids, params, params.n
        self.record, self.id = record, record.request_id
        self.created = int(time.time())
        self.offsets = [0] * self.n  # completions' text_offset, per choice

    def _envelope(self, choices: list, chunk: bool) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created,
                "model": self.ctx.model_name, "choices": choices}

    def _usage(self, num_completion: int) -> dict:
        return {"prompt_tokens": len(self.prompt_ids), "completion_tokens": num_completion,
                "total_tokens": len(self.prompt_ids) + num_completion}

    def _choice(self, index: int, text: str, token_ids: list[int], entries, finish, stop,
                delta: bool) -> dict:
        if self.chat:
            message = {"content": text} if delta else {"role": "assistant", "content": text}
            choice = {"index": index, ("delta" if delta else "message"): message,
                      "logprobs": self._chat_logprobs(entries) if entries is not None else None}
        else:
            choice = {"index": index, "text": text,
                      "logprobs": self._completion_logprobs(index, entries) if entries is not None else None}
        choice["finish_reason"] = _FINISH[finish] if finish is not None else None
        if finish is not None:
            choice["stop_reason"] = stop or None
        if self.body.return_token_ids:
            choice["token_ids"] = token_ids
        return choice

    def _completion_logprobs(self, index: int, entries) -> dict:
        text = self.ctx.token_text
        tokens, token_logprobs, top, offsets = [], [], [], []
        for token_id, logprob, _rank, top_ids, top_lps in entries:
            tokens.append(text(token_id))
            token_logprobs.append(logprob)
            top.append({text(t): lp for t, lp in zip(top_ids, top_lps)})
            offsets.append(self.offsets[index])
            self.offsets[index] += len(tokens[-1])
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top,
                "text_offset": offsets}

    def _chat_logprobs(self, entries) -> dict:
        text = self.ctx.token_text

        def one(token_id: int, logprob: float) -> dict:
            s = text(token_id)
            return {"token": s, "logprob": logprob, "bytes": list(s.encode("utf-8", "replace"))}

        return {"content": [
            {**one(token_id, logprob), "top_logprobs": [one(t, lp) for t, lp in zip(top_ids, top_lps)]}
            for token_id, logprob, _rank, top_ids, top_lps in entries]}

    async def collect(self) -> dict:
        """The whole response; the engine's iterator is closed (the request aborted) when
        this is cancelled."""
        n = self.n
        ids: list[list[int]] = [[] for _ in range(n)]
        texts: list[list[str]] = [[] for _ in range(n)]
        entries: list[list | None] = [None] * n
        last = [None] * n
        async with aclosing(self.ctx.engine.generate(self.prompt_ids, self.params)) as outs:
            async for out in outs:
                i = out.index
                self.record.add_output(len(out.new_token_ids))
                ids[i] += out.new_token_ids
                texts[i].append(out.new_text)
                if out.logprobs is not None:
                    entries[i] = (entries[i] or []) + list(out.logprobs)
                last[i] = out
        choices = [self._choice(i, "".join(texts[i]), ids[i], entries[i], last[i].finish_reason,
                                last[i].matched_stop, delta=False) for i in range(n)]
        answer = self._envelope(choices, chunk=False)
        answer["usage"] = self._usage(sum(out.num_output_tokens for out in last))
        if self.body.return_token_ids:
            answer["prompt_token_ids"] = self.prompt_ids
        return answer

    def _event(self, choices: list, usage=False, usage_value=None) -> str:
        chunk = self._envelope(choices, chunk=True)
        if usage:
            chunk["usage"] = usage_value
        return f"data: {json.dumps(chunk)}\n\n"

    async def events(self):
        """Server-sent events: a chunk per engine output, the usage chunk when asked, [DONE].
        Cancelled when the client goes: leaving the iterator aborts the request."""
        include_usage = self.body.include_usage
        num_completion, record = 0, self.record
        try:
            async with aclosing(self.ctx.engine.generate(self.prompt_ids, self.params)) as outs:
                if self.chat:  # the role comes first, as OpenAI sends it
                    for i in range(self.n):
                        yield self._event([{"index": i, "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None}],
                                          include_usage)
                async for out in outs:
                    record.add_output(len(out.new_token_ids))
                    choice = self._choice(out.index, out.new_text, out.new_token_ids, out.logprobs,
                                          out.finish_reason, out.matched_stop, delta=True)
                    if out.finish_reason is not None:
                        num_completion += out.num_output_tokens
                    yield self._event([choice], include_usage)
            record.unfinished = False
            if include_usage:
                yield self._event([], True, self._usage(num_completion))
        except RequestError as e:
            status, error = errors.request_error_body(e)  # an internal one notes its error id
            record.unfinished = False
            record.answered(status, error["error"]["message"], error["error"]["param"])
            yield f"data: {json.dumps(error)}\n\n"
        yield "data: [DONE]\n\n"
