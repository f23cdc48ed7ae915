"""A chat request's tool fields, checked before any work and turned into a plan: which choice
(none, auto, required, a named function), the prompt with the tools (render.py), the parser of
the model's calls. Every refusal is INVALID_ARGUMENT (HTTP 400) naming its field as the client
sent it ("tools.2.function.name", "tool_choice", "messages.3.tool_call_id")."""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass

from llmserve.structured.constraint import ConstraintError, json_schema
from scheduler_svc.api.prompts import utf8_len
from scheduler_svc.api.request_params import RawParams
from scheduler_svc.api.tools import forced
from scheduler_svc.api.tools.hermes import HermesFormat
from scheduler_svc.api.tools.llama3_json import Llama3JsonFormat
from scheduler_svc.api.tools.render import ToolChatPrompt, ToolTurn
from scheduler_svc.api.tools.response import ToolOutputs
from scheduler_svc.api.validation import SizeLimits, invalid

FORMATS = {f.name: f for f in (HermesFormat, Llama3JsonFormat)}  # --tool-call-parser's names
MAX_TOOLS = 128  # OpenAI's limit
MAX_SCHEMA_DEPTH = 32  # nesting of a function's parameters schema
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names


@dataclass(frozen=True)
class ToolSettings:
    """The server's flags: --enable-auto-tool-choice and --tool-call-parser."""

    auto: bool = False
    parser: str = ""

    @classmethod
    def from_config(cls, config) -> ToolSettings:
        return cls(config.enable_auto_tool_choice, config.tool_call_parser)


@dataclass(frozen=True)
class ToolPlan:
    choice: str  # "none", "auto", "required" or "named"
    functions: tuple[dict, ...]  # each tool's "function" object, as sent
    parallel: bool  # parallel_tool_calls: false = at most one call
    named: str | None = None  # tool_choice's function
    format: type = HermesFormat

    @property
    def names(self) -> frozenset[str]:
        return frozenset(f["name"] for f in self.functions)

    def schema(self) -> dict | None:
        """The JSON schema the output must follow (required, named), else None."""
        if self.choice == "named":
            return forced.named_schema(next(f for f in self.functions if f["name"] == self.named))
        if self.choice == "required":
            return forced.required_schema(list(self.functions), self.parallel)
        return None

    def new_parser(self):
        """A fresh stream parser for one choice's output; None when calls are not parsed."""
        if self.choice == "auto":
            return self.format.parser(self.names)
        if self.choice == "required":
            return forced.required_parser(self.names)
        if self.choice == "named":
            return forced.NamedParser(self.named)
        return None

    def outputs(self, n: int) -> ToolOutputs | None:
        """The response writer for n choices; None when nothing is parsed."""
        return ToolOutputs(self, n) if self.choice != "none" else None


def prepare_chat(body, settings: ToolSettings, sizes: SizeLimits):
    """(prompt, raw params, ToolPlan or None) of a chat request; a chat without tools or tool
    turns is the body's own prompt, unchanged."""
    plan = plan_tools(body, settings, sizes)
    if plan is None:
        return body.to_prompt(), body.to_raw(), None
    turns = [ToolTurn(m.role, m.text, tuple((c.id, c.function.name, c.function.arguments)
                                             for c in m.tool_calls or ()), m.tool_call_id)
             for m in body.messages]
    tools = tuple({"type": "function", "function": f} for f in plan.functions)
    prompt = ToolChatPrompt(turns, body.add_generation_prompt, tools, plan.format)
    return prompt, _with_schema(body.to_raw(), plan.schema()), plan


def _with_schema(raw: RawParams, schema: dict | None) -> RawParams:
    """The forced choices' grammar: their JSON schema as the request's structured output."""
    if schema is None:
        return raw
    if raw.constraint is not None:
        raise invalid(f"tool_choice and {raw.constraint.param} both constrain the output; send one",
                      "tool_choice")
    try:
        return dataclasses.replace(raw, constraint=json_schema(schema, "tool_choice"))
    except ConstraintError as e:  # (the tools' schemas are too large for a grammar)
        raise invalid(e.message, "tool_choice") from None


def plan_tools(body, settings: ToolSettings, sizes: SizeLimits) -> ToolPlan | None:
    tools, choice = body.tools, body.tool_choice
    has_turns = _check_messages(body.messages)
    if tools is None and choice is None and not has_turns:
        return None
    if choice is not None and not tools:
        raise invalid("tool_choice needs tools: send the tools the model may call", "tool_choice")
    functions = _check_tools(tools or [])
    _check_size(body, functions, sizes)
    fmt = FORMATS[settings.parser] if settings.parser else HermesFormat
    parallel = body.parallel_tool_calls is not False
    if not tools or choice == "none":
        return ToolPlan("none", functions, parallel, format=fmt)
    if choice is None or choice == "auto":
        if not (settings.auto and settings.parser):
            raise invalid('tool_choice "auto" (the default when tools are sent) needs a server '
                          "started with --enable-auto-tool-choice and --tool-call-parser; send "
                          'tool_choice "none" to show the tools without parsing calls', "tool_choice")
        return ToolPlan("auto", functions, parallel, format=fmt)
    if choice == "required":
        return ToolPlan("required", functions, parallel, format=fmt)
    name = choice.function.name
    if name not in {f["name"] for f in functions}:
        raise invalid(f"tool_choice names the function {name!r}, which is not in tools", "tool_choice")
    return ToolPlan("named", functions, parallel, name, fmt)


def _check_tools(tools) -> tuple[dict, ...]:
    if len(tools) > MAX_TOOLS:
        raise invalid(f"tools has {len(tools)} tools; the limit is {MAX_TOOLS}", "tools")
    seen, functions = set(), []
    for i, tool in enumerate(tools):
        f = tool.function
        if not _NAME.fullmatch(f.name):
            raise invalid(f"function name {f.name[:80]!r} must be 1 to 64 letters, digits, '_' or "
                          "'-'", f"tools.{i}.function.name")
        if f.name in seen:
            raise invalid(f"two tools are named {f.name!r}; names must be unique", f"tools.{i}.function.name")
        seen.add(f.name)
        if f.parameters is not None:
            _check_parameters(f.parameters, f"tools.{i}.function.parameters")
        functions.append(f.model_dump(exclude_none=True))
    return tuple(functions)


def _check_parameters(schema: dict, param: str) -> None:
    if schema.get("type", "object") != "object":
        raise invalid(f"parameters must be a JSON schema of type \"object\", got type "
                      f"{json.dumps(schema['type'])[:80]}", param)
    stack = [(schema, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise invalid(f"parameters nest deeper than {MAX_SCHEMA_DEPTH} levels", param)
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        stack += [(v, depth + 1) for v in children if isinstance(v, (dict, list))]


def _check_messages(messages) -> bool:
    """Tool fields only where they belong; True when any message has one (or is a tool result)."""
    has_turns = False
    for i, m in enumerate(messages):
        if m.tool_calls is not None and m.role != "assistant":
            raise invalid(f"tool_calls belong to assistant messages, not {m.role!r} ones",
                          f"messages.{i}.tool_calls")
        if m.role == "tool" and m.tool_call_id is None:
            raise invalid("a tool message needs the tool_call_id of the call it answers",
                          f"messages.{i}.tool_call_id")
        if m.tool_call_id is not None and m.role != "tool":
            raise invalid(f"tool_call_id belongs to tool messages, not {m.role!r} ones",
                          f"messages.{i}.tool_call_id")
        has_turns = has_turns or m.role == "tool" or bool(m.tool_calls)
    return has_turns


def _check_size(body, functions: tuple[dict, ...], sizes: SizeLimits) -> None:
    """The tools and the calls count towards --max-prompt-bytes with the messages' text."""
    tool_bytes = utf8_len(json.dumps(functions, ensure_ascii=False))
    if tool_bytes > sizes.max_prompt_bytes:
        raise invalid(f"tools have {tool_bytes} bytes of JSON; the limit is {sizes.max_prompt_bytes} "
                      "(--max-prompt-bytes)", "tools")
    total = tool_bytes + sum(utf8_len(m.role) + utf8_len(m.text) + sum(
        utf8_len(c.id) + utf8_len(c.function.name) + utf8_len(c.function.arguments)
        for c in m.tool_calls or ()) + utf8_len(m.tool_call_id or "") for m in body.messages)
    if total > sizes.max_prompt_bytes:
        raise invalid(f"the chat has {total} bytes of messages, tool calls and tools; the limit is "
                      f"{sizes.max_prompt_bytes} (--max-prompt-bytes)", "messages")
