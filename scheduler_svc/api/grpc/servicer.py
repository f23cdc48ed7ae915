"""The public gRPC API (llmserve.v1.LLMServe): thin methods that validate, convert and stream.

Order of the checks for a new request, cheapest first: sizes and emptiness (validation, no
tokenization), the waiting-queue bound, tokenization in the pool (refused on the token count
as soon as it is known), then the ids and sampling parameters.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import grpc

from protos.llmserve.v1 import llmserve_pb2 as pb
from protos.llmserve.v1 import llmserve_pb2_grpc as pb_grpc
from scheduler_svc.api import access_log
from scheduler_svc.api.admission import Admission
from scheduler_svc.api.grpc import codec
from scheduler_svc.api.grpc.handlers import abort_with
from scheduler_svc.api.validation import check_detokenize_ids, check_prompt_size, invalid
from scheduler_svc.messages import RequestError

log = logging.getLogger("llmserve.api")
# A response needing more logprob messages than this is built on a worker thread (~1 us a
# message: prompt logprobs of a long prompt would hold the loop for a large part of a second).
INLINE_MAX_LOGPROB_MESSAGES = 2048

class LLMServeServicer(pb_grpc.LLMServeServicer):
    """Answers the public RPCs; all state lives in the engine."""

    def __init__(self, admission: Admission, model_name: str):
        self._admission = admission  # the API process's one (the HTTP door shares it)
        self._engine = admission.engine
        self._pool = admission.pool
        self._sizes = admission.sizes
        self._model_name = model_name
        self._limits = admission.limits

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext):
        request_id, record, prompt_ids, params = await self._admit(request, context)
        num_finished = num_completion = 0
        try:
            async for out in self._engine.generate(prompt_ids, params):
                record.add_output(len(out.new_token_ids))
                msg = await _off_the_loop_if_large(codec.num_logprob_messages(out),
                                                   codec.response_to_pb, request_id, out)
                if out.finish_reason is not None:
                    num_finished += 1
                    num_completion += out.num_output_tokens
                    if num_finished == params.n:  # the stream's last message
                        msg.total_usage.CopyFrom(codec.usage_to_pb(len(prompt_ids), num_completion))
                yield msg
        except RequestError as e:
            await abort_with(context, e)

    async def Complete(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext):
        request_id, record, prompt_ids, params = await self._admit(request, context)
        n = params.n
        token_ids: list[list[int]] = [[] for _ in range(n)]
        texts: list[list[str]] = [[] for _ in range(n)]
        logprobs: list[list | None] = [None] * n
        prompt_logprobs, last = None, [None] * n
        try:
            async for out in self._engine.generate(prompt_ids, params):
                i = out.index
                record.add_output(len(out.new_token_ids))
                token_ids[i] += out.new_token_ids
                texts[i].append(out.new_text)
                if out.logprobs is not None:
                    logprobs[i] = (logprobs[i] or [])
                    logprobs[i].extend(out.logprobs)
                prompt_logprobs = out.prompt_logprobs or prompt_logprobs
                last[i] = out
        except RequestError as e:
            await abort_with(context, e)
        for i, out in enumerate(last):
            out.new_token_ids, out.new_text, out.logprobs = token_ids[i], "".join(texts[i]), logprobs[i]
            out.prompt_logprobs = prompt_logprobs if i == 0 else None
        usage = codec.usage_to_pb(len(prompt_ids), sum(out.num_output_tokens for out in last))
        return await _off_the_loop_if_large(
            sum(codec.num_logprob_messages(out) for out in last), lambda: pb.CompleteResponse(
                request_id=request_id, choices=[codec.response_to_pb(request_id, o) for o in last],
                usage=usage))

    async def Tokenize(self, request: pb.TokenizeRequest, context: grpc.aio.ServicerContext):
        try:
            prompt = codec.prompt_from_pb(request)
            check_prompt_size(prompt, self._sizes, self._limits)
            max_model_len = self._limits.max_model_len
            encoded = await self._pool.encode(prompt, max_model_len, with_tokens=True)
            if encoded.num_tokens > max_model_len:
                raise invalid(f"the input has {encoded.num_tokens} tokens; Tokenize answers up to "
                              f"the model's context of {max_model_len} tokens")
        except RequestError as e:
            await abort_with(context, e)
        return pb.TokenizeResponse(token_ids=encoded.token_ids, tokens=encoded.tokens)

    async def Detokenize(self, request: pb.DetokenizeRequest, context: grpc.aio.ServicerContext):
        try:
            token_ids = check_detokenize_ids(request.token_ids, self._limits)
            skip = request.skip_special_tokens if request.HasField("skip_special_tokens") else True
            text = await self._pool.decode(token_ids, skip)
        except RequestError as e:
            await abort_with(context, e)
        return pb.DetokenizeResponse(text=text)

    async def GetModelInfo(self, request, context):
        info = self._engine.info
        return pb.GetModelInfoResponse(
            model_name=self._model_name, max_model_len=info.max_model_len,
            vocab_size=info.vocab_size, eos_token_ids=info.eos_token_ids, block_size=info.block_size,
            max_logprobs=info.max_logprobs, max_logit_bias=info.max_logit_bias, max_n=self._sizes.max_n,
        )

    async def GetServerStatus(self, request, context):
        s = self._engine.stats
        return pb.GetServerStatusResponse(
            total_blocks=s.num_total_blocks, free_blocks=s.num_free_blocks,
            used_blocks=s.num_total_blocks - s.num_free_blocks,
            num_running=s.num_running, num_waiting=s.num_waiting, num_steps=s.num_steps,
            executor_busy_us=s.forward_us + s.sample_us, num_graph_steps=s.num_graph_steps,
            executor_available=s.executor_available,
            prefix_cache_queries=s.prefix_cache_queries, prefix_cache_hits=s.prefix_cache_hits,
            prefix_cache_hit_rate=s.prefix_cache_hits / s.prefix_cache_queries if s.prefix_cache_queries else 0.0,
            step_timings=pb.StepTimings(
                schedule_us=s.schedule_us, apply_us=s.apply_us, result_wait_us=s.result_wait_us,
                executor_queued_us=s.executor_queued_us, executor_launch_us=s.executor_launch_us,
                device_idle_us=s.device_idle_us, apply_deferred_us=s.apply_deferred_us,
                executor_launch_cpu_us=s.executor_launch_cpu_us),
        )

    async def _admit(self, request: pb.GenerateRequest, context):
        """(request id, the call's access-log record, prompt ids, sampling params): checks,
        tokenizes and validates (admission.Admission); aborts the call with a clear status when
        the request is bad."""
        request_id = request.request_id or uuid.uuid4().hex
        record = access_log.current()
        record.request_id = request_id
        try:
            prompt = codec.prompt_from_pb(request)
            raw = codec.raw_params_from_pb(request.params)
            prompt_ids, params = await self._admission.admit(prompt, raw, request.request_id)
        except RequestError as e:
            await abort_with(context, e)
        record.admitted(request_id, len(prompt_ids))
        return request_id, record, prompt_ids, params


async def _off_the_loop_if_large(num_messages: int, build, *args):
    """build(*args), on a worker thread when it makes many messages."""
    if num_messages <= INLINE_MAX_LOGPROB_MESSAGES:
        return build(*args)
    return await asyncio.get_running_loop().run_in_executor(None, build, *args)
