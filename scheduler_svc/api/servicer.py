"""The public gRPC API (llmserve.v1.LLMServe): thin methods that validate, convert and stream.

Order of the checks for a new request, cheapest first: sizes and emptiness (validation, no
tokenization), the waiting-queue bound, tokenization in the pool (refused on the token count
as soon as it is known), then the ids and sampling parameters.
"""

from __future__ import annotations

import logging
import time
import uuid

import grpc

from protos.llmserve.v1 import llmserve_pb2 as pb
from protos.llmserve.v1 import llmserve_pb2_grpc as pb_grpc
from scheduler_svc.api import codec
from scheduler_svc.api.engine_client import EngineClient
from scheduler_svc.api.handlers import abort_with
from scheduler_svc.api.prompts import Prompt, TokenIdsPrompt
from scheduler_svc.api.tokenize_pool import TokenizePool
from scheduler_svc.api.validation import (Limits, SizeLimits, build_sampling_params,
                                          check_detokenize_ids, check_prompt, check_prompt_len,
                                          check_prompt_size, check_request_size, invalid)
from scheduler_svc.messages import RequestError

log = logging.getLogger("llmserve.api")

class LLMServeServicer(pb_grpc.LLMServeServicer):
    """Answers the public RPCs; all state lives in the engine."""

    def __init__(self, engine: EngineClient, tokenize_pool: TokenizePool, sizes: SizeLimits,
                 model_name: str, max_waiting: int):
        self._engine = engine
        self._pool = tokenize_pool
        self._sizes = sizes
        self._model_name = model_name
        self._max_waiting = max_waiting
        self._num_refused_full, self._last_full_log = 0, 0.0  # refusals not yet logged
        info = engine.info
        self._limits = Limits(
            max_model_len=info.max_model_len, vocab_size=info.vocab_size,
            block_size=info.block_size, num_usable_blocks=info.num_blocks - 1,
        )

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext):
        request_id = request.request_id or uuid.uuid4().hex
        prompt_ids, params = await self._admit(request, context)
        try:
            async for out in self._engine.generate(prompt_ids, params):
                yield codec.response_to_pb(request_id, out)
        except RequestError as e:
            await abort_with(context, e)

    async def Complete(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext):
        request_id = request.request_id or uuid.uuid4().hex
        prompt_ids, params = await self._admit(request, context)
        token_ids: list[int] = []
        text: list[str] = []
        try:
            async for out in self._engine.generate(prompt_ids, params):
                token_ids += out.new_token_ids
                text.append(out.new_text)
                last = out
        except RequestError as e:
            await abort_with(context, e)
        last.new_token_ids, last.new_text = token_ids, "".join(text)
        return codec.response_to_pb(request_id, last)

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
        return pb.ModelInfo(
            model_name=self._model_name, max_model_len=info.max_model_len,
            vocab_size=info.vocab_size, eos_token_ids=info.eos_token_ids, block_size=info.block_size,
        )

    async def GetServerStatus(self, request, context):
        s = self._engine.stats
        return pb.ServerStatus(
            total_blocks=s.num_total_blocks, free_blocks=s.num_free_blocks,
            used_blocks=s.num_total_blocks - s.num_free_blocks,
            num_running=s.num_running, num_waiting=s.num_waiting, num_steps=s.num_steps,
            executor_busy_us=s.forward_us + s.sample_us, num_graph_steps=s.num_graph_steps,
            executor_available=s.executor_available,
            prefix_cache_queries=s.prefix_cache_queries, prefix_cache_hits=s.prefix_cache_hits,
            prefix_cache_hit_rate=s.prefix_cache_hits / s.prefix_cache_queries if s.prefix_cache_queries else 0.0,
        )

    async def _admit(self, request: pb.GenerateRequest, context) -> tuple[list[int], object]:
        """Checks, tokenizes and validates; aborts the call with a clear status when the request
        is bad."""
        try:
            prompt = codec.prompt_from_pb(request)
            raw = codec.raw_params_from_pb(request.params)
            check_prompt_size(prompt, self._sizes, self._limits)
            check_request_size(raw, request.request_id, self._sizes)
            self._check_capacity()
            prompt_ids = await self._prompt_ids(prompt)
            check_prompt(prompt_ids, self._limits)
            params = build_sampling_params(raw, len(prompt_ids), self._limits)
        except RequestError as e:
            await abort_with(context, e)
        return prompt_ids, params

    def _check_capacity(self) -> None:
        """At most max_num_seqs running plus --max-waiting waiting requests; counted here, as
        they are admitted, so a burst cannot outrun the engine core's (one step old) figures."""
        capacity = self._engine.info.max_num_seqs + self._max_waiting
        if self._engine.num_requests >= capacity:
            self._num_refused_full += 1
            if time.monotonic() - self._last_full_log >= 1.0:  # a burst logs once a second
                log.warning("server full: refused %d requests (%d running or waiting, --max-waiting %d)",
                            self._num_refused_full, self._engine.num_requests, self._max_waiting)
                self._last_full_log, self._num_refused_full = time.monotonic(), 0
            raise RequestError("RESOURCE_EXHAUSTED", f"the server is full ({capacity} requests "
                               f"running or waiting, --max-waiting {self._max_waiting}); retry later")

    async def _prompt_ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, TokenIdsPrompt):
            return list(prompt.ids)
        encoded = await self._pool.encode(prompt, self._limits.max_model_len - 1)
        check_prompt_len(encoded.num_tokens, self._limits)
        return encoded.token_ids
