"""`--tool-call-parser llama3_json`: Llama 3.1-3.3's JSON tool calls, the whole answer being
the calls (json_calls.py parses them):

    {"name": "get_weather", "parameters": {"city": "Paris"}}

optionally after `<|python_tag|>` (a special token, so normally not in the text) and several
separated by `; `. An answer that starts with anything but `{` is content. Also the format's
prompt text (Meta's words in the Llama 3.1 template), for a template that does not render
tools (render.py); Llama 3's own templates do."""

from __future__ import annotations

import json

from scheduler_svc.api.tools.json_calls import JsonCallsParser

PYTHON_TAG = "<|python_tag|>"

SYSTEM_PROMPT = """Given the following functions, please respond with a JSON for a function call \
with its proper arguments that best answers the given prompt.

Respond in the format {{"name": function name, "parameters": dictionary of argument name and its \
value}}. Do not use variables.

{tools}"""


def llama3_parser(names: frozenset[str]) -> JsonCallsParser:
    return JsonCallsParser(names, prefix=PYTHON_TAG, separator=";")


class Llama3JsonFormat:
    name = "llama3_json"
    parser = staticmethod(llama3_parser)

    @staticmethod
    def system_prompt(tools: list[dict]) -> str:
        return SYSTEM_PROMPT.format(tools="\n\n".join(json.dumps(t, indent=4, ensure_ascii=False)
                                                      for t in tools))

    @staticmethod
    def render_calls(calls: list[tuple[str, str]]) -> str:
        return "; ".join(f'{{"name": {json.dumps(name, ensure_ascii=False)}, "parameters": {arguments}}}'
                         for name, arguments in calls)

    @staticmethod
    def render_results(results: list[str]) -> str:
        return "\n".join(results)
