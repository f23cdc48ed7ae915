"""A chat with tools, rendered by the model's chat template (in the tokenize pool, where the
template is): as transformers' apply_chat_template renders it when the template renders tools
(the jinja2 variable `tools`: the request's tools as sent, `{"type": "function", "function":
{...}}`; an assistant turn's `tool_calls` with their arguments as objects, a tool result's
`tool_call_id`), else with the tools described in the system message in the server's format
(hermes unless --tool-call-parser says otherwise), the calls made so far written into their
assistant turns in that format, and each run of tool results one user turn (hermes:
`<tool_response>` blocks), so a template that knows only system, user and assistant renders it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

import jinja2
import jinja2.meta

from scheduler_svc.api.prompts import ChatPrompt


@dataclass(frozen=True)
class ToolTurn:
    """A chat message with its tool fields: `tool_calls` as (id, name, arguments) triples."""

    role: str
    content: str
    tool_calls: tuple[tuple[str, str, str], ...] = ()
    tool_call_id: str | None = None


@lru_cache(maxsize=16)
def renders_tools(template: str | None) -> bool:
    """Whether the template reads the variable `tools` (then it is given them as HF gives them)."""
    if not template:
        return False
    try:
        ast = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
    except jinja2.TemplateSyntaxError:
        return False
    return "tools" in jinja2.meta.find_undeclared_variables(ast)


def _arguments_value(arguments: str):
    """Arguments as a template reads them: the JSON object, or the text when it is not one."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


def _arguments_json(arguments: str) -> str:
    """Arguments as JSON text for a format's call: as sent when JSON, else as a JSON string."""
    try:
        json.loads(arguments)
    except ValueError:
        return json.dumps(arguments, ensure_ascii=False)
    return arguments


@dataclass(frozen=True)
class ToolChatPrompt(ChatPrompt):
    tools: tuple[dict, ...] = ()  # as sent: {"type": "function", "function": {...}}
    format: type | None = None  # the format that describes tools a template does not render

    def render(self, tokenizer) -> str:
        if renders_tools(tokenizer.chat_template):
            return tokenizer.render_chat(self.native_messages(), self.add_generation_prompt,
                                         tools=list(self.tools) or None)
        return tokenizer.render_chat(self.injected_messages(), self.add_generation_prompt)

    def native_messages(self) -> list[dict]:
        out = []
        for m in self.messages:
            message = {"role": m.role, "content": m.content}
            if m.tool_calls:
                message["tool_calls"] = [
                    {"id": call_id, "type": "function",
                     "function": {"name": name, "arguments": _arguments_value(arguments)}}
                    for call_id, name, arguments in m.tool_calls]
            if m.tool_call_id is not None:
                message["tool_call_id"] = m.tool_call_id
            out.append(message)
        return out

    def injected_messages(self) -> list[dict]:
        fmt = self.format
        out: list[dict] = []
        results: list[str] = []  # a run of tool results, one user turn
        for m in self.messages:
            if m.role == "tool":
                results.append(m.content)
                continue
            if results:
                out.append({"role": "user", "content": fmt.render_results(results)})
                results = []
            content = m.content
            if m.tool_calls:
                calls = fmt.render_calls([(name, _arguments_json(args)) for _, name, args in m.tool_calls])
                content = f"{content}\n{calls}" if content else calls
            out.append({"role": m.role, "content": content})
        if results:
            out.append({"role": "user", "content": fmt.render_results(results)})
        if self.tools:
            described = fmt.system_prompt([dict(t) for t in self.tools])
            if out and out[0]["role"] == "system":
                out[0]["content"] = f"{out[0]['content']}\n\n{described}" if out[0]["content"] else described
            else:
                out.insert(0, {"role": "system", "content": described})
        return out
