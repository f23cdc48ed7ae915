"""The request body of POST /v1/responses (pydantic), in OpenAI's shapes. As on the other
routes no field is silently ignored: an unknown field is refused with 400 naming it; the
fields OpenAI defines that this server does not implement are declared so that refuse.py can
say why (checked before any work). Items, content parts, tools and tool choices of a type this server does not serve
parse as `Other` (their `type` and whatever else they hold) and are refused there by name."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from scheduler_svc.api.http.schemas import _Body


class Other(BaseModel):
    """Something of a type this server does not serve: kept to be refused by its type."""

    model_config = ConfigDict(extra="allow")
    type: str


def _by_type(known: tuple[str, ...], default: str | None = None, text: bool = False):
    """A discriminator: the tag of a known `type` (capitalised: errors' paths skip it), else
    Other; with `text`, a string is "Str" (a union's branches are chosen, not all tried, so a
    refusal names the field of the branch the client meant)."""
    def pick(value):
        if text and isinstance(value, str):
            return "Str"
        kind = value.get("type", default) if isinstance(value, dict) else getattr(value, "type", default)
        return kind.title().replace("_", "") if kind in known else "Other"
    return Discriminator(pick)


def _text_or(list_type):
    """A string, or a list (`list_type`): e.g. a message's content."""
    return Annotated[Annotated[str, Tag("Str")] | Annotated[list_type, Tag("List")],
                     Discriminator(lambda v: "Str" if isinstance(v, str) else "List")]


# ---------------------------------------------------------------- input items


class TextPart(_Body):
    """input_text (user, system, developer) or output_text (an assistant's earlier answer)."""

    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None  # an output_text sent back: bookkeeping, not read
    logprobs: list[Any] | None = None  # likewise


Part = Annotated[Annotated[TextPart, Tag("InputText")] | Annotated[TextPart, Tag("OutputText")]
                 | Annotated[Other, Tag("Other")], _by_type(("input_text", "output_text"))]


class MessageItem(_Body):
    """A message ({"role", "content"}, with or without "type": "message"). `id` and `status`
    come with an output message sent back as input; they do not change the prompt."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: _text_or(list[Part])
    id: str | None = None
    status: str | None = None
    phase: str | None = None  # the newest SDKs' output messages carry it


class FunctionCallItem(_Body):
    """A call the model made earlier (an output item sent back)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Body):
    """A call's result: text, or input_text parts."""

    type: Literal["function_call_output"]
    call_id: str
    output: _text_or(list[Part])
    id: str | None = None
    status: str | None = None


Item = Annotated[Annotated[MessageItem, Tag("Message")] | Annotated[FunctionCallItem, Tag("FunctionCall")]
                 | Annotated[FunctionCallOutputItem, Tag("FunctionCallOutput")] | Annotated[Other, Tag("Other")],
                 _by_type(("message", "function_call", "function_call_output"), default="message")]


# ---------------------------------------------------------------- tools and formats


class FunctionTool(_Body):
    """A function tool, in the Responses API's flat shape."""

    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


Tool = Annotated[Annotated[FunctionTool, Tag("Function")] | Annotated[Other, Tag("Other")],
                 _by_type(("function",))]


class FunctionChoice(_Body):
    type: Literal["function"]
    name: str


ToolChoice = Annotated[Annotated[Literal["none", "auto", "required"], Tag("Str")]
                       | Annotated[FunctionChoice, Tag("Function")] | Annotated[Other, Tag("Other")],
                       _by_type(("function",), text=True)]


class TextFormat(_Body):
    """text.format: text, json_object, or json_schema (name, schema, strict, description)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(_Body):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class Reasoning(_Body):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class StreamOptions(_Body):
    include_obfuscation: bool | None = None  # no obfuscation padding is sent either way


class ResponsesRequest(_Body):
    model: str | None = None
    input: _text_or(list[Item])
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None  # vLLM's extra (as on chat)
    top_logprobs: int | None = None
    include: list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    # kept responses (stored.py): keep this one (unset = true), continue a kept one
    store: bool | None = None
    previous_response_id: str | None = None
    # bookkeeping: cannot change the output
    metadata: dict[str, str] | None = None  # echoed and kept (refuse.py bounds it)
    user: str | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    # OpenAI's fields this server does not implement: refused by name (refuse.py)
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None
    reasoning: Reasoning | None = None
    truncation: Literal["auto", "disabled"] | None = None
    max_tool_calls: int | None = None
    prompt: dict[str, Any] | None = None
