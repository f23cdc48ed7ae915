"""The request bodies of POST /v1/messages and /v1/messages/count_tokens (pydantic), in
Anthropic's shapes. As on every route no field is silently ignored: an unknown field is refused
with 400 naming it. Content blocks, tool result parts and tools of a type this server does not
serve (images, documents, thinking, server tools, ...) parse as `Other` and are refused by
refuse.py, naming the field; so are the declared fields it does not implement (`thinking`,
`container`, `mcp_servers`, `output_config.effort`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, Tag

from scheduler_svc.api.http.responses.schemas import Other, _by_type, _text_or
from scheduler_svc.api.http.schemas import _Body


class CacheControl(_Body):
    """A prompt-caching breakpoint: accepted, changes nothing (the prefix cache is automatic)."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(_Body):
    type: Literal["text"]
    text: str = Field(min_length=1)  # as Anthropic's: "text content blocks must be non-empty"
    cache_control: CacheControl | None = None
    # (citations: null only, which is "unset"; a list of citations is refused as unknown)


class ToolUseBlock(_Body):
    """A call the assistant made earlier."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None


ResultPart = Annotated[Annotated[TextBlock, Tag("Text")] | Annotated[Other, Tag("Other")], _by_type(("text",))]


class ToolResultBlock(_Body):
    """A call's result, in a user message: text, or text blocks."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: _text_or(list[ResultPart]) = ""
    is_error: bool = False
    cache_control: CacheControl | None = None


Block = Annotated[Annotated[TextBlock, Tag("Text")] | Annotated[ToolUseBlock, Tag("ToolUse")]
                  | Annotated[ToolResultBlock, Tag("ToolResult")] | Annotated[Other, Tag("Other")],
                  _by_type(("text", "tool_use", "tool_result"))]


class Message(_Body):
    role: Literal["user", "assistant"]
    content: _text_or(list[Block])


class CustomTool(_Body):
    """A tool the client runs (Anthropic's "custom" tool, `type` optional)."""

    type: Literal["custom"] = "custom"
    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool | None = None  # as chat's: forced choices follow the schema by grammar
    eager_input_streaming: bool | None = None  # the input is streamed as written either way
    cache_control: CacheControl | None = None


Tool = Annotated[Annotated[CustomTool, Tag("Custom")] | Annotated[Other, Tag("Other")],
                 _by_type(("custom",), default="custom")]


class ToolChoice(_Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None  # type "tool": the tool to call
    disable_parallel_tool_use: bool | None = None  # true: at most one call


class Metadata(_Body):
    user_id: str | None = None  # bookkeeping: cannot change the output


class JsonFormat(_Body):
    """output_config.format: the answer is JSON of this schema (structured outputs)."""

    model_config = _Body.model_config | {"populate_by_name": True}
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Body):
    format: JsonFormat | None = None
    effort: str | None = None  # refused: the model does not reason


class _Prompt(_Body):
    """What both routes read: what the model is shown."""

    model: str
    messages: list[Message]
    system: _text_or(list[TextBlock]) | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    cache_control: CacheControl | None = None  # (automatic prompt caching: changes nothing)
    # Anthropic's fields this server does not implement: refused by name (refuse.py)
    thinking: dict[str, Any] | None = None  # {"type": "disabled"} is accepted
    mcp_servers: list[Any] | None = None
    output_config: OutputConfig | None = None


class CountTokensRequest(_Prompt):
    pass


class MessagesRequest(_Prompt):
    max_tokens: int
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None  # an extra (as vLLM's on chat): reproducible sampling
    stream: bool = False
    metadata: Metadata | None = None
    # bookkeeping and routing: cannot change the output (one tier, one region, one speed)
    service_tier: Literal["auto", "standard_only"] | None = None
    inference_geo: str | None = None
    speed: Literal["standard", "fast"] | None = None
    container: str | dict[str, Any] | None = None  # refused (no code execution)
