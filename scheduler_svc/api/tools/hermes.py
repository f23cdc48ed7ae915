"""`--tool-call-parser hermes`: calls as JSON objects in tags, anywhere in the text
(Hermes 2 Pro, Qwen2.5, Qwen3 write them so):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Content is the text outside the blocks, less the whitespace next to a block. Streamed, content
goes out at once except what might still become `<tool_call>`: a proper start of the tag at
the text's end and the whitespace before it. A block whose object is not a call of one of the
request's tools (not JSON of that shape, an unknown name) is content, exactly as written; a
block cut short by the end of the text keeps the call it started. Also the format's prompt
text, for a chat template that does not render tools (render.py)."""

from __future__ import annotations

import json

from scheduler_svc.api.tools.events import Content, Event, ModeParser, longest_prefix_suffix
from scheduler_svc.api.tools.scan import DONE, FAILED, CallScanner

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesParser(ModeParser):
    def __init__(self, names: frozenset[str]):
        self.names = names
        self._mode = "content"  # content, call, close (after a call's object), skip
        self._pending = ""  # text held back: content, or what follows a call's object
        self._strip_leading = False  # the whitespace after a block is not content
        self._scanner: CallScanner | None = None
        self._held: list[str] = []  # a block not yet a call, as written (content if it fails)
        self._num_calls = 0

    def _release(self, out: list[Event]) -> None:
        if self._mode == "content" and self._pending:
            out.append(Content(self._pending))
        elif self._mode == "call" and not self._scanner.started:
            out.append(Content("".join(self._held)))

    def _content(self, text: str, out: list[Event]) -> str:
        if self._strip_leading:
            text = text.lstrip()
            self._strip_leading = not text
        pending = self._pending + text
        i = pending.find(OPEN)
        if i < 0:
            keep = longest_prefix_suffix(pending, OPEN)
            cut = len(pending) - keep
            while cut > 0 and pending[cut - 1].isspace():
                cut -= 1
            if cut:
                out.append(Content(pending[:cut]))
            self._pending = pending[cut:]
            return ""
        before = pending[:i].rstrip()
        if before:
            out.append(Content(before))
        self._held = [pending[len(before):i + len(OPEN)]]  # with the whitespace before the tag
        self._scanner = CallScanner(self.names, self._num_calls)
        self._pending, self._mode = "", "call"
        return pending[i + len(OPEN):]

    def _call(self, text: str, out: list[Event]) -> str:
        scanner = self._scanner
        n = scanner.feed(text, out)
        if not scanner.started:
            self._held.append(text[:n])
        if scanner.status == DONE:
            self._num_calls += 1
            self._mode = "close"
        elif scanner.status == FAILED:
            if scanner.started:  # a call cut short: its arguments stand, the rest of the block goes
                self._num_calls += 1
                self._mode = "skip"
            else:  # not a call: the block is content, as written
                out.append(Content("".join(self._held)))
                self._mode = "content"
        return text[n:]

    def _close(self, text: str, out: list[Event]) -> str:
        rest = (self._pending + text).lstrip()
        self._pending = ""
        if rest.startswith(CLOSE):
            self._mode, self._strip_leading = "content", True
            return rest[len(CLOSE):]
        if rest and CLOSE.startswith(rest):
            self._pending = rest  # maybe the closing tag
            return ""
        if rest:  # no closing tag: what follows is content again
            self._mode, self._strip_leading = "content", True
        return rest

    def _skip(self, text: str, out: list[Event]) -> str:
        pending = self._pending + text
        i = pending.find(CLOSE)
        if i < 0:
            self._pending = pending[len(pending) - longest_prefix_suffix(pending, CLOSE):]
            return ""
        self._pending, self._mode, self._strip_leading = "", "content", True
        return pending[i + len(CLOSE):]


SYSTEM_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


class HermesFormat:
    """The hermes prompt text (Qwen2.5's template's words) and its calls and results."""

    name = "hermes"
    parser = HermesParser

    @staticmethod
    def system_prompt(tools: list[dict]) -> str:
        return SYSTEM_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))

    @staticmethod
    def render_calls(calls: list[tuple[str, str]]) -> str:
        return "\n".join(f'{OPEN}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": '
                         f"{arguments}}}\n{CLOSE}" for name, arguments in calls)

    @staticmethod
    def render_results(results: list[str]) -> str:
        return "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)
