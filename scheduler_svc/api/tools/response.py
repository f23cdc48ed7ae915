"""The model's calls in OpenAI's chat shapes, from the choices generate.py builds.

Collected: `message.tool_calls` (`[{"id", "type": "function", "function": {"name",
"arguments"}}]`), `content` the text outside the calls, null when there is none. Streamed,
each choice's text goes through its own stream parser and comes out as deltas: content as
`{"content": ...}`; a call's first delta `{"tool_calls": [{"index", "id", "type": "function",
"function": {"name", "arguments": <what is known, maybe "">}}]}`, then
`{"tool_calls": [{"index", "function": {"arguments": <the next piece>}}]}`. One engine output
may become several chunks (one per delta), or none while the parser holds text back; the
first carries the output's logprobs and token ids, the last its finish reason.

The finish reason is "tool_calls" when a call was made and the output stopped by itself (EOS,
a stop string or token; "length" stays), except for a named function (OpenAI and vLLM answer
"stop" there). With parallel_tool_calls false only the first call is kept."""

from __future__ import annotations

import copy
import uuid

from scheduler_svc.api.tools.events import CallArgs, CallStart, Content, Event, parse_all


def call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class ToolOutputs:
    def __init__(self, plan, n: int):
        self.plan = plan
        self._parsers: dict[int, object] = {}
        self._ids: dict[tuple[int, int], str] = {}
        self._called: set[int] = set()  # choices that made a call

    def _parser(self, index: int):
        if index not in self._parsers:
            self._parsers[index] = self.plan.new_parser()
        return self._parsers[index]

    def _finish_reason(self, index: int, finish: str | None) -> str | None:
        if finish == "stop" and index in self._called and self.plan.choice != "named":
            return "tool_calls"
        return finish

    def _id(self, index: int, call: int) -> str:
        return self._ids.setdefault((index, call), call_id())

    def message(self, choice: dict) -> dict:
        """A collected choice with its calls."""
        i, message = choice["index"], choice["message"]
        parsed = parse_all(self._parser(i), message["content"])
        calls = parsed.calls if self.plan.parallel else parsed.calls[:1]
        if not calls:
            return choice
        self._called.add(i)
        message["content"] = parsed.content or None
        message["tool_calls"] = [{"id": self._id(i, k), "type": "function",
                                  "function": {"name": name, "arguments": arguments}}
                                 for k, (name, arguments) in enumerate(calls)]
        choice["finish_reason"] = self._finish_reason(i, choice["finish_reason"])
        return choice

    def deltas(self, choice: dict) -> list[dict]:
        """A streamed choice (its delta's content: the output's new text) as the choices of
        the chunks to send, maybe none."""
        i, finish = choice["index"], choice["finish_reason"]
        parser = self._parser(i)
        text = choice["delta"].get("content") or ""
        events = parser.feed(text) if text else []
        if finish is not None:
            events += parser.finish()
        if not self.plan.parallel:
            events = [e for e in events if isinstance(e, Content) or e.index == 0]
        deltas = self._group(i, events)
        if not deltas:
            if finish is None and choice.get("logprobs") is None and not choice.get("token_ids"):
                return []
            deltas = [{}]
        out = []
        for k, delta in enumerate(deltas):
            c = copy.copy(choice)
            c["delta"] = delta
            if k:  # the output's logprobs and token ids went with the first chunk
                c["logprobs"] = None
                if "token_ids" in c:
                    c["token_ids"] = []
            if k < len(deltas) - 1:
                c["finish_reason"] = None
                c.pop("stop_reason", None)
            out.append(c)
        out[-1]["finish_reason"] = self._finish_reason(i, finish)
        return out

    def _group(self, i: int, events: list[Event]) -> list[dict]:
        deltas: list[dict] = []
        for e in events:
            last = deltas[-1] if deltas else {}
            if isinstance(e, Content):
                if not e.text:
                    continue
                if "content" in last:
                    last["content"] += e.text
                else:
                    deltas.append({"content": e.text})
            elif isinstance(e, CallStart):
                self._called.add(i)
                deltas.append({"tool_calls": [{"index": e.index, "id": self._id(i, e.index),
                                               "type": "function",
                                               "function": {"name": e.name, "arguments": ""}}]})
            elif isinstance(e, CallArgs):
                calls = last.get("tool_calls")
                if calls and calls[0]["index"] == e.index:
                    calls[0]["function"]["arguments"] += e.text
                else:
                    deltas.append({"tool_calls": [{"index": e.index, "function": {"arguments": e.text}}]})
        return deltas
