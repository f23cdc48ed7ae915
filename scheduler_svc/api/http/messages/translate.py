"""A Messages request as the chat completion it is, so that it is admitted as one (chat
template, tools, structured outputs, the one validation of sampling parameters):

- `system` (text or text blocks, joined): a system message first;
- a message whose content is a string: a chat message of its role;
- an assistant message: its text blocks joined as the content, its `tool_use` blocks as the
  turn's tool calls (`input` as JSON text), in the order written;
- a user message: each `tool_result` block a tool message answering its `tool_use_id` (its
  text, joined; `is_error` true puts "Error: " before it, the one mark a chat template can
  show), each run of text blocks a user message, in the order written;
- custom tools as chat's function tools (`input_schema` the parameters), `tool_choice` `auto`,
  `any`, `tool` and `none` as chat's `auto`, `required`, a named function and `none`,
  `disable_parallel_tool_use` as `parallel_tool_calls: false`; `stop_sequences` as `stop`;
  `output_config.format` as `response_format` json_schema.

A refusal of the chat's admission names the chat's field; `client_param` turns it back into
the Messages request's ("messages.3.tool_call_id" -> "messages.2.content.1.tool_use_id")."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from scheduler_svc.api.http.constraints import JsonSchemaFormat, ResponseFormat
from scheduler_svc.api.http.field_names import message_param, renamed
from scheduler_svc.api.http.messages.schemas import (MessagesRequest, TextBlock, ToolResultBlock, ToolUseBlock,
                                                     _Prompt)
from scheduler_svc.api.http.schemas import ChatCompletionRequest, ChatMessage
from scheduler_svc.api.tools.fields import (CalledFunction, FunctionDefinition, MessageToolCall, NamedFunction,
                                            NamedToolChoice, Tool)

ERROR_MARK = "Error: "  # before the text of a tool_result with is_error true
_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
# the chat's (and the domain's) field -> the Messages request's
_FIELDS = {"stop": "stop_sequences", "prompt": "messages", "max_completion_tokens": "max_tokens",
           "parallel_tool_calls": "tool_choice.disable_parallel_tool_use"}
_FORMAT = (("response_format.json_schema.schema", "output_config.format.schema"),
           ("response_format.json_schema", "output_config.format"), ("response_format", "output_config.format"))
_TOOL_KEYS = {"parameters": "input_schema"}


@dataclass
class ChatOfMessages:
    chat: ChatCompletionRequest
    origins: list[str]  # per chat message, where it came from: "system", "messages.3", or
    # "messages.3.content.1" (a tool_result block, or the first text block of a run)

    def client_param(self, param: str | None) -> str | None:
        if param is None:
            return None
        if param.startswith("messages."):
            found = message_param(param, len(self.origins))
            if found is None:
                return "messages"
            origin, key = self.origins[found[0]], found[1].partition(".")[0]
            if origin == "system" or not key:
                return origin
            if key == "tool_call_id":
                return origin + ".tool_use_id"
            return origin if origin.count(".") > 1 else origin + ".content"
        if param.startswith("tools.") and ".function." in param:
            head, _, rest = param.partition(".function.")  # tools.2.function.parameters.x
            key, dot, tail = rest.partition(".")
            return head + "." + _TOOL_KEYS.get(key, key) + dot + tail
        return renamed(param, _FORMAT, _FIELDS)

    def client_message(self, message: str) -> str:
        """A refusal's message with the chat's field names as this request spells them."""
        for ours, theirs in _FORMAT:
            message = re.sub(rf"\b{re.escape(ours)}\b", theirs, message)
        for ours, theirs in (("stop", "stop_sequences"), ("parameters", "input_schema")):
            if re.match(rf"{ours}\b", message):  # (only where the message names the field)
                message = theirs + message[len(ours):]
        return message


def _text(content: str | list) -> str:
    return content if isinstance(content, str) else "".join(b.text for b in content if isinstance(b, TextBlock))


def _result(block: ToolResultBlock) -> str:
    text = _text(block.content)
    return ERROR_MARK + text if block.is_error else text


def _messages(body: _Prompt) -> tuple[list[ChatMessage], list[str]]:
    messages, origins = [], []

    def add(message: ChatMessage, origin: str) -> None:
        messages.append(message)
        origins.append(origin)

    if body.system is not None:
        add(ChatMessage(role="system", content=_text(body.system)), "system")
    for i, m in enumerate(body.messages):
        if isinstance(m.content, str):
            add(ChatMessage(role=m.role, content=m.content), f"messages.{i}")
        elif m.role == "assistant":
            calls = [MessageToolCall(id=b.id, function=CalledFunction(
                name=b.name, arguments=json.dumps(b.input, ensure_ascii=False)))
                for b in m.content if isinstance(b, ToolUseBlock)]
            add(ChatMessage(role="assistant", content=_text(m.content), tool_calls=calls or None), f"messages.{i}")
        else:
            run: list[str] = []  # the text blocks since the last tool_result
            start, num_added = 0, len(messages)
            for j, b in enumerate(m.content):
                if isinstance(b, ToolResultBlock):
                    if run:
                        add(ChatMessage(role="user", content="".join(run)), f"messages.{i}.content.{start}")
                        run = []
                    add(ChatMessage(role="tool", tool_call_id=b.tool_use_id, content=_result(b)),
                        f"messages.{i}.content.{j}")
                elif isinstance(b, TextBlock):
                    if not run:
                        start = j
                    run.append(b.text)
            if run or len(messages) == num_added:  # (an empty content is an empty user turn)
                add(ChatMessage(role="user", content="".join(run)),
                    f"messages.{i}.content.{start}" if run else f"messages.{i}")
    return messages, origins


def _tool_choice(body: _Prompt):
    choice = body.tool_choice
    if choice is None:
        return None
    if choice.type == "tool":
        return NamedToolChoice(type="function", function=NamedFunction(name=choice.name))
    return _CHOICES[choice.type]


def _response_format(body: _Prompt) -> ResponseFormat | None:
    f = body.output_config.format if body.output_config is not None else None
    if f is None:
        return None
    return ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat.model_validate(
        {"name": "output", "schema": f.schema_}))


def to_chat(body: _Prompt) -> ChatOfMessages:
    """The chat completion request of a Messages (or count_tokens) request, refuse.check_refused
    first."""
    messages, origins = _messages(body)
    tools = None if body.tools is None else [
        Tool(type="function", function=FunctionDefinition(
            name=t.name, description=t.description, parameters=t.input_schema, strict=t.strict))
        for t in body.tools]
    choice = body.tool_choice
    fields = dict(messages=messages, tools=tools, tool_choice=_tool_choice(body),
                  parallel_tool_calls=False if choice is not None and choice.disable_parallel_tool_use else None,
                  response_format=_response_format(body))
    if isinstance(body, MessagesRequest):
        fields.update(max_tokens=body.max_tokens, temperature=body.temperature, top_p=body.top_p,
                      top_k=body.top_k, seed=body.seed, stop=body.stop_sequences)
    return ChatOfMessages(ChatCompletionRequest(**fields), origins)
