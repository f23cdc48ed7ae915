"""The calls of `tool_choice` "required" and a named function: a grammar (a JSON schema in the
sampling parameters, structured outputs) forces the model's whole output, so no format is
parsed, only that JSON (vLLM's design):

- named: the output is the function's arguments, one call of that function;
- required: the output is an array of one or more (one: `parallel_tool_calls` false) objects
  `{"name": <one of the tools>, "parameters": <its arguments>}`.

`named_schema` and `required_schema` are those JSON schemas; the parsers read the outputs."""

from __future__ import annotations

from scheduler_svc.api.tools.events import CallArgs, CallStart, Event
from scheduler_svc.api.tools.json_calls import JsonCallsParser

EMPTY_PARAMETERS = {"type": "object", "properties": {}}  # a function without parameters


def parameters_of(function: dict) -> dict:
    return function.get("parameters") or EMPTY_PARAMETERS


def named_schema(function: dict) -> dict:
    """The named choice's output: the function's arguments."""
    return parameters_of(function)


def required_schema(functions: list[dict], parallel: bool) -> dict:
    """The required choice's output: a non-empty array of calls of the tools."""
    calls = [{"type": "object",
              "properties": {"name": {"type": "string", "enum": [f["name"]]},
                             "parameters": parameters_of(f)},
              "required": ["name", "parameters"]} for f in functions]
    schema = {"type": "array", "minItems": 1,
              "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def required_parser(names: frozenset[str]) -> JsonCallsParser:
    return JsonCallsParser(names, opener="[", separator=",", closer="]")


class NamedParser:
    """The whole output is the named function's arguments."""

    def __init__(self, name: str):
        self.name, self._started, self._empty = name, False, True

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        if not self._started:
            self._started = True
            out.append(CallStart(0, self.name))
        if text:
            self._empty = False
            out.append(CallArgs(0, text))
        return out

    def finish(self) -> list[Event]:
        out = self.feed("")
        if self._empty:
            self._empty = False
            out.append(CallArgs(0, "{}"))
        return out
