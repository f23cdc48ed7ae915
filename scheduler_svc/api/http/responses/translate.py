"""A Responses request as the chat completion it is, so that it is admitted as one (chat
template, tools, structured outputs, the one validation of sampling parameters):

- `instructions`: a system message first; `input` a string: one user message;
- a message item: a chat message (role `developer` rendered as `system`: open models'
  templates know system), its content the text of its parts joined;
- `function_call` items: the calls of an assistant turn (a run of them, and the assistant
  message just before them, are one turn: as the model wrote them); `function_call_output`:
  a tool message answering its `call_id`, which must be a call earlier in the input;
- function tools in the flat shape as chat's `{"type": "function", "function": {...}}`,
  `tool_choice` `{"type": "function", "name"}` as chat's named choice, `text.format` as
  `response_format`, `max_output_tokens` as `max_tokens`, `include` logprobs as `logprobs`.

With `previous_response_id`, the kept conversation's items (stored.py) come after
`instructions` and before `input`, translated as the input's are.

A refusal of the chat's admission names the chat's field; `client_param` turns it back into
the Responses request's ("messages.3.tool_call_id" -> "input.4.call_id")."""

from __future__ import annotations

import re
from dataclasses import dataclass

from scheduler_svc.api.http.constraints import JsonSchemaFormat, ResponseFormat
from scheduler_svc.api.http.field_names import message_param, renamed
from scheduler_svc.api.http.responses.refuse import LOGPROBS
from scheduler_svc.api.http.responses.schemas import (FunctionCallItem, FunctionCallOutputItem, FunctionChoice,
                                                      MessageItem, ResponsesRequest, TextPart)
from scheduler_svc.api.http.schemas import ChatCompletionRequest, ChatMessage
from scheduler_svc.api.tools.fields import (CalledFunction, FunctionDefinition, MessageToolCall, NamedFunction,
                                            NamedToolChoice, Tool)
from scheduler_svc.api.validation import invalid

# the chat's (and the domain's) field -> the Responses request's
_FIELDS = {"max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens",
           "prompt": "input", "logprobs": "include", "messages": "input"}
_FORMAT = (("response_format.json_schema.schema", "text.format.schema"),
           ("response_format.json_schema", "text.format"), ("response_format", "text.format"))
_MESSAGE_KEYS = {"tool_call_id": "call_id", "tool_calls": None}  # None: the item itself
PREVIOUS = "previous_response_id"  # the origin of the messages of a kept conversation


@dataclass
class ChatOfResponse:
    chat: ChatCompletionRequest
    origins: list[str]  # per chat message, where it came from: "instructions", "input", "input.3",
    # "previous_response_id" (the kept conversation it continues)

    def client_param(self, param: str | None) -> str | None:
        if param is None:
            return None
        if param.startswith("messages."):
            found = message_param(param, len(self.origins))
            if found is None:
                return "input"
            origin = self.origins[found[0]]
            if origin == PREVIOUS:
                return PREVIOUS  # a message of the kept conversation
            key, _, tail = found[1].partition(".")
            key = _MESSAGE_KEYS.get(key, key)
            return ".".join(p for p in (origin, key, tail) if p)
        if param.startswith("tools.") and ".function." in param:
            return param.replace(".function.", ".", 1)  # tools.2.function.name -> tools.2.name
        return renamed(param, _FORMAT, _FIELDS)

    def client_message(self, message: str) -> str:
        """A refusal's message with the chat's field names as this request spells them."""
        for ours, theirs in (*_FORMAT, ("max_tokens", "max_output_tokens")):
            message = re.sub(rf"\b{re.escape(ours)}\b", theirs, message)
        return message


def _text(content: str | list[TextPart]) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


def _messages(body: ResponsesRequest, previous: tuple) -> tuple[list[ChatMessage], list[str]]:
    messages, origins = [], []
    if body.instructions is not None:
        messages.append(ChatMessage(role="system", content=body.instructions))
        origins.append("instructions")
    own = [MessageItem(role="user", content=body.input)] if isinstance(body.input, str) else body.input
    calls: set[str] = set()
    for i, item in enumerate((*previous, *own)):
        i -= len(previous)
        where = PREVIOUS if i < 0 else "input" if isinstance(body.input, str) else f"input.{i}"
        if isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            messages.append(ChatMessage(role=role, content=_text(item.content)))
        elif isinstance(item, FunctionCallItem):
            call = MessageToolCall(id=item.call_id, function=CalledFunction(name=item.name, arguments=item.arguments))
            calls.add(item.call_id)
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant":
                last.tool_calls = [*(last.tool_calls or ()), call]  # the same assistant turn
                continue
            messages.append(ChatMessage(role="assistant", tool_calls=[call]))
        elif isinstance(item, FunctionCallOutputItem):
            if item.call_id not in calls:
                raise invalid(f"no function_call with call_id {item.call_id[:80]!r} comes before this "
                              "function_call_output in the input", f"{where}.call_id")
            messages.append(ChatMessage(role="tool", tool_call_id=item.call_id, content=_text(item.output)))
        origins.append(where)
    return messages, origins


def _response_format(body: ResponsesRequest) -> ResponseFormat | None:
    f = body.text.format if body.text is not None else None
    if f is None or f.type == "text":
        return None
    if f.type == "json_object":
        return ResponseFormat(type="json_object")
    return ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat.model_validate(
        {"name": f.name, "description": f.description, "schema": f.schema_, "strict": f.strict}))


def _tool_choice(body: ResponsesRequest):
    choice = body.tool_choice
    if isinstance(choice, FunctionChoice):
        return NamedToolChoice(type="function", function=NamedFunction(name=choice.name))
    return choice


def to_chat(body: ResponsesRequest, previous: tuple = ()) -> ChatOfResponse:
    """The chat completion request of a Responses request (refuse.check_refused first) after
    the conversation `previous` (items) its previous_response_id continues (after instructions:
    the previous response's own are not carried over, as OpenAI's are not)."""
    messages, origins = _messages(body, previous)
    tools = None if body.tools is None else [
        Tool(type="function", function=FunctionDefinition(
            name=t.name, description=t.description, parameters=t.parameters, strict=t.strict))
        for t in body.tools]
    logprobs = LOGPROBS in (body.include or ())
    chat = ChatCompletionRequest(
        messages=messages, max_tokens=body.max_output_tokens, temperature=body.temperature,
        top_p=body.top_p, seed=body.seed, logprobs=logprobs,
        top_logprobs=body.top_logprobs if logprobs else None, tools=tools, tool_choice=_tool_choice(body),
        parallel_tool_calls=body.parallel_tool_calls, response_format=_response_format(body))
    return ChatOfResponse(chat, origins)
