"""POST /v1/completions and /v1/chat/completions: admitted like gRPC requests, then streamed as
server-sent events or collected into one response. Leaving the engine's iterator aborts the
request (its KV blocks are freed): a stream is cancelled when its client goes; a collecting
request watches request.is_disconnected(). Several completions prompts are merged into one
stream (fanout.py); echo and prompt logprobs are echo.py's."""

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
from scheduler_svc.api.http.echo import Echo, completion_logprobs, token_logprobs, vllm_prompt_logprobs
from scheduler_svc.api.http.fanout import admit_prompts, merged
from scheduler_svc.api.http.schemas import ChatCompletionRequest, CompletionRequest
from scheduler_svc.api.prompts import TextPrompt
from scheduler_svc.api.tools.plan import ToolPlan, prepare_chat
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
        prompt, raw, tools = prepare_chat(body, ctx.tools, ctx.admission.sizes) if chat else (
            None, body.to_raw(), None)  # a chat's tools (api/tools/)
        prompts = [prompt] if chat else body.to_prompts()
        admitted = await admit_prompts(ctx.admission, prompts, raw)
    except RequestError as e:
        e.param = body.client_param(e.param)  # as the client spelled it
        raise
    record.admitted(record.request_id, sum(len(ids) for ids, _ in admitted))
    texts = None if chat or not body.echo else [  # what echo puts ahead of each choice
        p.text if isinstance(p, TextPrompt) else await ctx.admission.pool.decode(ids, False)
        for p, (ids, _) in zip(prompts, admitted)]
    job = _Job(ctx, body, chat, admitted, record, texts, tools)
    if body.stream:
        record.unfinished = True  # until the engine's iterator ends: else the client left
        return StreamingResponse(job.events(), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache"})
    return await collected(request, job.collect())


async def collected(request: Request, answer) -> Response:
    """The JSON of the coroutine `answer` (a whole response), or 499 when the client leaves
    first: `answer` is cancelled, which leaves the engine's iterator and aborts the request."""
    task = asyncio.create_task(answer)
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if not task.done() and await request.is_disconnected():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                return Response(status_code=499)
    finally:
        if not task.done():
            task.cancel()
    return JSONResponse(task.result())


class _Job:
    """One admitted request and its responses in OpenAI's shapes."""

    def __init__(self, ctx: HttpContext, body, chat: bool, admitted: list, record: access_log.Record,
                 texts: list[str] | None, tools: ToolPlan | None = None):
        self.ctx, self.body, self.chat, self.admitted = ctx, body, chat, admitted
        self.prompt_ids, params = admitted[0]
        self.n = params.n * len(admitted)  # choices: prompt i's sample j is choice i * n + j
        self.echo = Echo(body, [ids for ids, _ in admitted], texts, params.n)
        self.record, self.id = record, record.request_id
        self.created = int(time.time())
        self.offsets = [0] * self.n  # completions' text_offset, per choice
        self.tools = tools.outputs(self.n) if tools else None  # the calls in the choices

    def _envelope(self, choices: list, chunk: bool) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created,
                "model": self.ctx.model_name, "choices": choices}

    def _usage(self, num_completion: int) -> dict:
        num_prompt = sum(len(ids) for ids, _ in self.admitted)
        return {"prompt_tokens": num_prompt, "completion_tokens": num_completion,
                "total_tokens": num_prompt + num_completion}

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
        logprobs, self.offsets[index] = completion_logprobs(
            self.ctx.token_text, entries, self.body.logprobs or 0, self.offsets[index])
        return logprobs

    def _prompt_logprobs(self, index: int) -> list | None:
        """vLLM's prompt_logprobs of choice `index`'s prompt (prompt_logprobs, or echo's k)."""
        k = self.body.prompt_logprobs
        k = self.body.logprobs if k is None and self.echo.echo else k
        return vllm_prompt_logprobs(self.ctx.token_text, self.echo.columns[index // self.echo.n], k or 0)

    def _chat_logprobs(self, entries) -> dict:
        return {"content": token_logprobs(self.ctx.token_text, entries)}

    async def collect(self) -> dict:
        """The whole response; the engine's iterator is closed (the request aborted) when
        this is cancelled."""
        n = self.n
        ids: list[list[int]] = [[] for _ in range(n)]
        texts: list[list[str]] = [[] for _ in range(n)]
        entries: list[list | None] = [None] * n
        last = [None] * n

        def add(out) -> None:
            i = out.index
            ids[i] += out.new_token_ids
            texts[i].append(out.new_text)
            if out.logprobs is not None:
                entries[i] = (entries[i] or []) + list(out.logprobs)
            last[i] = out

        async with aclosing(merged(self.ctx.engine, self.admitted)) as outs:
            async for out in outs:
                self.record.add_output(len(out.new_token_ids))
                for ready in self.echo.ready(out):
                    add(ready)
        for ready in self.echo.rest():
            add(ready)
        choices = [self._choice(i, "".join(texts[i]), ids[i], entries[i], last[i].finish_reason,
                                last[i].matched_stop, delta=False) for i in range(n)]
        if self.tools:
            choices = [self.tools.message(c) for c in choices]
        answer = self._envelope(choices, chunk=False)
        answer["usage"] = self._usage(sum(out.num_output_tokens for out in last))
        self._add_prompt_fields(answer)
        return answer

    def _add_prompt_fields(self, answer: dict) -> None:
        """prompt_logprobs when asked (or echoed) and prompt_token_ids with return_token_ids:
        on each choice of a completion (vLLM's place), top level on chat."""
        lp = self.body.prompt_logprobs is not None or self.echo.logprobs is not None
        if self.chat:
            if lp:
                answer["prompt_logprobs"] = self._prompt_logprobs(0)
        else:
            for choice in answer["choices"]:
                if lp:
                    choice["prompt_logprobs"] = self._prompt_logprobs(choice["index"])
                if self.body.return_token_ids:
                    choice["prompt_token_ids"] = self.admitted[choice["index"] // self.echo.n][0]
        if self.body.return_token_ids and len(self.admitted) == 1:
            answer["prompt_token_ids"] = self.prompt_ids

    def _event(self, choices: list, usage=False, usage_value=None) -> str:
        chunk = self._envelope(choices, chunk=True)
        if usage:
            chunk["usage"] = usage_value
        return f"data: {json.dumps(chunk)}\n\n"

    def _delta(self, out, include_usage: bool) -> str:
        choice = self._choice(out.index, out.new_text, out.new_token_ids, out.logprobs,
                              out.finish_reason, out.matched_stop, delta=True)
        choices = self.tools.deltas(choice) if self.tools else [choice]  # tool calls: 0 to many
        return "".join(self._event([c], include_usage) for c in choices)

    async def events(self):
        """Server-sent events: a chunk per engine output, the usage chunk when asked, [DONE].
        Cancelled when the client goes: leaving the iterator aborts the request."""
        include_usage = self.body.include_usage
        num_completion, record = 0, self.record
        try:
            async with aclosing(merged(self.ctx.engine, self.admitted)) as outs:
                if self.chat:  # the role comes first, as OpenAI sends it
                    for i in range(self.n):
                        yield self._event([{"index": i, "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None}],
                                          include_usage)
                async for out in outs:
                    record.add_output(len(out.new_token_ids))
                    for ready in self.echo.ready(out):
                        num_completion += ready.num_output_tokens if ready.finish_reason is not None else 0
                        yield self._delta(ready, include_usage)
            for ready in self.echo.rest():
                num_completion += ready.num_output_tokens if ready.finish_reason is not None else 0
                yield self._delta(ready, include_usage)
            record.unfinished = False
            if include_usage:
                yield self._event([], True, self._usage(num_completion))
        except RequestError as e:
            status, error = errors.request_error_body(e)  # an internal one notes its error id
            record.unfinished = False
            record.answered(status, error["error"]["message"], error["error"]["param"])
            yield f"data: {json.dumps(error)}\n\n"
        yield "data: [DONE]\n\n"
