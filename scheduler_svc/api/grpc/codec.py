"""The public API's codec: llmserve.v1 messages <-> the scheduler's domain objects.

(The executor's messages are converted by step_protocol.codec.)
"""

from __future__ import annotations

from google.protobuf import unknown_fields

from llmserve.structured import constraint as sc
from protos.llmserve.v1 import llmserve_pb2 as pb
from scheduler_svc.api.prompts import ChatPrompt, Prompt, TextPrompt, TokenIdsPrompt
from scheduler_svc.api.request_params import RawParams
from scheduler_svc.api.structured import request_error
from scheduler_svc.api.validation import invalid
from scheduler_svc.core.outputs import LogprobColumns, RequestOutput
from scheduler_svc.core.request import FinishReason


_FINISH_TO_PB = {
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.EOS: pb.FINISH_REASON_EOS,
    FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED,
}


def response_to_pb(request_id: str, out: RequestOutput) -> pb.GenerateResponse:
    """One streamed message of sample out.index; the sample's final one carries finish
    reason and usage, its first the prompt logprobs (sample 0)."""
    msg = pb.GenerateResponse(request_id=request_id, token_ids=out.new_token_ids,
                              text=out.new_text, index=out.index)
    if out.logprobs is not None:
        add = msg.logprobs.add
        for token_id, logprob, rank, top_ids, top_logprobs in out.logprobs:
            _add_top(add(token_id=token_id, logprob=logprob, rank=rank), top_ids, top_logprobs)
    if out.prompt_logprobs is not None:
        _add_prompt_logprobs(msg, out.prompt_logprobs)
    if out.finish_reason is not None:
        msg.finish_reason = _FINISH_TO_PB[out.finish_reason]
        msg.matched_stop = out.matched_stop
        msg.usage.prompt_tokens = out.num_prompt_tokens
        msg.usage.completion_tokens = out.num_output_tokens
    return msg


def num_logprob_messages(out: RequestOutput) -> int:
    """How many TokenLogprob and TopLogprob messages response_to_pb builds for out (about a
    microsecond each)."""
    num = 0
    if out.logprobs:
        num += len(out.logprobs) * (1 + len(out.logprobs[-1][3]))
    if out.prompt_logprobs is not None:
        num += len(out.prompt_logprobs) * (1 + out.prompt_logprobs.num_top)
    return num


def _add_top(entry: pb.TokenLogprob, top_ids, top_logprobs) -> None:
    add = entry.top_logprobs.add  # add() is twice as fast as building and extending
    for token_id, logprob in zip(top_ids, top_logprobs):
        add(token_id=token_id, logprob=logprob)


def _add_prompt_logprobs(msg: pb.GenerateResponse, c: LogprobColumns) -> None:
    add, k = msg.prompt_logprobs.add, c.num_top
    for i, (token_id, logprob, rank) in enumerate(zip(c.token_ids, c.logprobs, c.ranks)):
        if rank == 0:  # the first prompt token: no logprob
            add(token_id=token_id)
        else:
            _add_top(add(token_id=token_id, logprob=logprob, rank=rank),
                     c.top_token_ids[i * k:(i + 1) * k], c.top_logprobs[i * k:(i + 1) * k])


def usage_to_pb(num_prompt_tokens: int, num_completion_tokens: int) -> pb.Usage:
    return pb.Usage(prompt_tokens=num_prompt_tokens, completion_tokens=num_completion_tokens)


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
        n=p.n if p.HasField("n") else None,
        logprobs=p.logprobs,
        top_logprobs=p.top_logprobs,
        prompt_logprobs=p.prompt_logprobs if p.HasField("prompt_logprobs") else None,
        presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty,
        repetition_penalty=p.repetition_penalty if p.HasField("repetition_penalty") else None,
        min_p=p.min_p,
        logit_bias=p.logit_bias,
        min_tokens=p.min_tokens,
        constraint=constraint_from_pb(p),
    )


def constraint_from_pb(p: pb.SamplingParams) -> sc.Constraint | None:
    """The params' constraint oneof (and its JSON options) as a Constraint; None when unset.
    A refusal names the field set ("json_schema", "choice", ...)."""
    kind = p.WhichOneof("constraint")
    if kind is None:
        return None
    try:
        if kind in ("json_schema", "json_object"):
            if kind == "json_object" and not p.json_object:
                raise invalid("json_object must be true when set (leave the constraint unset for "
                              "none)", "json_object")
            spec = p.json_schema if kind == "json_schema" else sc.JSON_OBJECT
            return sc.json_schema(spec, kind, lenient=p.json_lenient, whitespace=(
                "compact" if p.json_whitespace == pb.JSON_WHITESPACE_COMPACT else "flexible"),
                whitespace_pattern=p.json_whitespace_pattern if p.HasField("json_whitespace_pattern") else None)
        if kind == "choice":
            return sc.choice(p.choice.choices, "choice")
        return (sc.regex if kind == "regex" else sc.grammar)(getattr(p, kind), kind)
    except sc.ConstraintError as e:
        raise request_error(e) from None


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


def unknown_field(msg, path: str = "") -> str | None:
    """Where `msg` (or a message inside it) holds a field this server's proto does not declare
    (a newer client's): "params.#42", or None. Such a field is refused, not ignored: it might
    change the output. (~0.3 µs a message.)"""
    unknown = unknown_fields.UnknownFieldSet(msg)
    if len(unknown):
        return f"{path}#{unknown[0].field_number}"
    for fd, value in msg.ListFields():
        if fd.message_type is None or fd.message_type.GetOptions().map_entry:
            continue  # scalars, and our maps (scalar values)
        items = enumerate(value) if fd.is_repeated else ((None, value),)
        for i, item in items:
            where = f"{path}{fd.name}" + ("" if i is None else f"[{i}]") + "."
            found = unknown_field(item, where)
            if found is not None:
                return found
    return None
