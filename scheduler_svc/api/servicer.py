"""The public gRPC API (llmserve.v1.LLMServe): thin methods that validate, convert and stream."""

from __future__ import annotations

import logging
import uuid

import grpc

from protos.llmserve.v1 import llmserve_pb2 as pb
from protos.llmserve.v1 import llmserve_pb2_grpc as pb_grpc
from scheduler_svc.api import codec
from scheduler_svc.api.engine_client import EngineClient
from scheduler_svc.api.validation import Limits, build_sampling_params, check_prompt, invalid
from scheduler_svc.core.tokenizer import Tokenizer
from scheduler_svc.messages import RequestError

log = logging.getLogger("llmserve.api")


class LLMServeServicer(pb_grpc.LLMServeServicer):
    """Answers the public RPCs; all state lives in the engine."""

    def __init__(self, engine: EngineClient, tokenizer: Tokenizer, model_name: str, max_waiting: int):
        self._engine = engine
        self._tokenizer = tokenizer
        self._model_name = model_name
        self._max_waiting = max_waiting
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
            await context.abort(getattr(grpc.StatusCode, e.code), e.message)

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
            await context.abort(getattr(grpc.StatusCode, e.code), e.message)
        last.new_token_ids, last.new_text = token_ids, "".join(text)
        return codec.response_to_pb(request_id, last)

    async def Tokenize(self, request: pb.TokenizeRequest, context: grpc.aio.ServicerContext):
        try:
            if request.HasField("chat"):
                ids = self._render_chat(request.chat)
            else:
                add = request.add_special_tokens if request.HasField("add_special_tokens") else True
                ids = self._tokenizer.encode(request.text, add_special_tokens=add)
        except RequestError as e:
            await context.abort(getattr(grpc.StatusCode, e.code), e.message)
        return pb.TokenizeResponse(token_ids=ids, tokens=[self._tokenizer.id_to_token(i) or "" for i in ids])

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
        )

    async def _admit(self, request: pb.GenerateRequest, context) -> tuple[list[int], object]:
        """Tokenizes and validates; aborts the call with a clear status when the request is bad."""
        try:
            prompt_ids = self._prompt_ids(request)
            check_prompt(prompt_ids, self._limits)
            raw = codec.raw_params_from_pb(request.params)
            params = build_sampling_params(raw, len(prompt_ids), self._limits)
            if self._engine.stats.num_waiting >= self._max_waiting:
                raise RequestError("RESOURCE_EXHAUSTED",
                                   f"{self._max_waiting} requests are already waiting; retry later")
        except RequestError as e:
            await context.abort(getattr(grpc.StatusCode, e.code), e.message)
        return prompt_ids, params

    def _prompt_ids(self, request: pb.GenerateRequest) -> list[int]:
        kind = request.WhichOneof("input")
        if kind == "text":
            return self._tokenizer.encode(request.text)
        if kind == "token_ids":
            return list(request.token_ids.ids)
        if kind == "chat":
            return self._render_chat(request.chat)
        raise invalid("no input: set one of text, token_ids or chat")

    def _render_chat(self, chat: pb.ChatMessages) -> list[int]:
        messages, add_generation_prompt = codec.chat_from_pb(chat)
        if not messages:
            raise invalid("chat has no messages")
        try:
            return self._tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
        except Exception as e:  # a template error is the caller's input problem
            raise invalid(f"the chat template could not render these messages: {e}") from e
