"""The tool fields of a chat request body, in OpenAI's shapes (pydantic; http/schemas.py
declares them on the request and its messages). Unknown fields are refused, as everywhere in
the body; plan.py checks what a type cannot say (names, counts, sizes, schemas)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionDefinition(_Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of type object; none = no parameters
    strict: bool | None = None  # accepted: the arguments follow the schema where a grammar forces them


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(_Strict):
    name: str
    arguments: str  # JSON text, as the model wrote it


class MessageToolCall(_Strict):
    """A call an assistant message made (a turn of the conversation so far)."""

    id: str
    type: Literal["function"] = "function"
    function: CalledFunction
