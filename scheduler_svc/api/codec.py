"""The public API's codec: llmserve.v1 messages <-> the scheduler's domain objects.

(The executor's messages are converted by step_protocol.codec.)
"""

from __future__ import annotations

from protos.llmserve.v1 import llmserve_pb2 as pb
from scheduler_svc.api.prompts import ChatPrompt, Prompt, TextPrompt, TokenIdsPrompt
from scheduler_svc.api.validation import RawParams
from scheduler_svc.core.outputs import RequestOutput
from scheduler_svc.core.request import FinishReason


_FINISH_TO_PB = {
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.EOS: pb.FINISH_REASON_EOS,
    FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED,
}


def response_to_pb(request_id: str, out: RequestOutput) -> pb.GenerateResponse:
    """One streamed message; the final one carries finish reason and usage."""
    msg = pb.GenerateResponse(request_id=request_id, token_ids=out.new_token_ids, text=out.new_text)
    if out.finish_reason is not None:
        msg.finish_reason = _FINISH_TO_PB[out.finish_reason]
        msg.matched_stop = out.matched_stop
        msg.usage.prompt_tokens = out.num_prompt_tokens
        msg.usage.completion_tokens = out.num_output_tokens
    return msg


def raw_params_from_pb(p: pb.SamplingParams) -> RawParams:
    """The client's sampling fields, with proto3 `optional` presence kept as None; the
    repeated fields are not copied before validation has checked their sizes."""
    return RawParams(
        max_tokens=p.max_tokens if p.HasField("max_tokens") else None,
        temperature=p.temperature if p.HasField("temperature") else None,
        top_k=p.top_k,
        top_p=p.top_p if p.HasField("top_p") else None,
        seed=p.seed if p.HasField("seed") else None,
        stop=p.stop,
        stop_token_ids=p.stop_token_ids,
        ignore_eos=p.ignore_eos,
        include_stop_str_in_output=p.include_stop_str_in_output,
    )


def chat_from_pb(chat: pb.ChatMessages) -> ChatPrompt:
    add_generation_prompt = chat.add_generation_prompt if chat.HasField("add_generation_prompt") else True
    return ChatPrompt(chat.messages, add_generation_prompt)  # not copied: see ChatPrompt


def prompt_from_pb(request: pb.GenerateRequest | pb.TokenizeRequest) -> Prompt | None:
    """The request's input oneof; None when none is set. Token ids stay the wire's repeated
    field (a length check comes before any copy)."""
    kind = request.WhichOneof("input")
    if kind == "text":
        add = True
        if isinstance(request, pb.TokenizeRequest) and request.HasField("add_special_tokens"):
            add = request.add_special_tokens
        return TextPrompt(request.text, add_special_tokens=add)
    if kind == "token_ids":
        return TokenIdsPrompt(request.token_ids.ids)
    if kind == "chat":
        return chat_from_pb(request.chat)
    return None
