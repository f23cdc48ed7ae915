"""A response's output items, built from what the model writes as the tool-call parser reads
it (api/tools/events.py: content, the start of a call, pieces of its arguments), and the
stream events OpenAI sends for each step (without `sequence_number`: the stream numbers them).

Content goes into a `message` item with one `output_text` part; a call is a `function_call`
item of its own, in the order written. Each item is announced (`response.output_item.added`,
a message's part `response.content_part.added`), grows by deltas (`response.output_text.delta`,
`response.function_call_arguments.delta`) and is closed when the next item starts or the output
ends (`...done` events; its status `completed`, or `incomplete` when the response is). A
response whose model wrote nothing has one message with empty text. The collected response is
the same builder with its events dropped, so a stream always adds up to the collected answer."""

from __future__ import annotations

import copy
import uuid

from scheduler_svc.api.tools.events import CallArgs, CallStart, Content, Event
from scheduler_svc.api.tools.response import call_id


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputItems:
    """The output of one response. `parallel` false keeps the first call only."""

    def __init__(self, parallel: bool = True):
        self.items: list[dict] = []  # as the response's `output`
        self._open: dict | None = None  # the item being written
        self._calls: dict[int, dict] = {}  # the parser's call index -> its item
        self._parallel = parallel

    def add(self, events: list[Event], logprobs: list[dict] | None = None) -> list[dict]:
        """The stream events of one engine output: its parsed events, and its tokens' logprobs
        (only without tools: then its text is one Content, or none while bytes are held back)."""
        out: list[dict] = []
        if logprobs and not any(isinstance(e, Content) for e in events):
            events = [Content(""), *events]
        for e in events:
            if isinstance(e, Content):
                if e.text or logprobs:
                    self._content(e.text, logprobs or [], out)
                    logprobs = None
            elif isinstance(e, CallStart):
                if self._parallel or e.index == 0:
                    self._start_call(e, out)
            elif isinstance(e, CallArgs) and self._open is not None and self._calls.get(e.index) is self._open:
                item = self._open  # (a call dropped by parallel false has no item)
                item["arguments"] += e.text
                out.append({"type": "response.function_call_arguments.delta", "item_id": item["id"],
                            "output_index": len(self.items) - 1, "delta": e.text})
        return out

    def finish(self, status: str) -> list[dict]:
        """Closes the output (status "completed" or "incomplete"); its last events."""
        out: list[dict] = []
        if not self.items:
            self._open_message(out)
        self._close(status, out)
        return out

    def _added(self, item: dict, out: list[dict]) -> None:
        self._open = item
        self.items.append(item)
        out.append({"type": "response.output_item.added", "output_index": len(self.items) - 1,
                    "item": copy.deepcopy(item)})

    def _open_message(self, out: list[dict]) -> dict:
        self._close("completed", out)
        item = {"id": _item_id("msg"), "type": "message", "status": "in_progress", "role": "assistant",
                "content": []}
        self._added(item, out)
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        item["content"].append(part)
        out.append({"type": "response.content_part.added", "item_id": item["id"],
                    "output_index": len(self.items) - 1, "content_index": 0, "part": copy.deepcopy(part)})
        return item

    def _content(self, text: str, logprobs: list[dict], out: list[dict]) -> None:
        item = self._open if self._open is not None and self._open["type"] == "message" else \
            self._open_message(out)
        part = item["content"][0]
        part["text"] += text
        part["logprobs"] += logprobs
        out.append({"type": "response.output_text.delta", "item_id": item["id"],
                    "output_index": len(self.items) - 1, "content_index": 0, "delta": text,
                    "logprobs": logprobs})

    def _start_call(self, e: CallStart, out: list[dict]) -> None:
        self._close("completed", out)
        item = {"id": _item_id("fc"), "type": "function_call", "status": "in_progress",
                "call_id": call_id(), "name": e.name, "arguments": ""}
        self._calls[e.index] = item
        self._added(item, out)

    def _close(self, status: str, out: list[dict]) -> None:
        item, self._open = self._open, None
        if item is None:
            return
        index = len(self.items) - 1  # the open item is the last
        if item["type"] == "message":
            part = item["content"][0]
            out.append({"type": "response.output_text.done", "item_id": item["id"], "output_index": index,
                        "content_index": 0, "text": part["text"], "logprobs": part["logprobs"]})
            out.append({"type": "response.content_part.done", "item_id": item["id"], "output_index": index,
                        "content_index": 0, "part": copy.deepcopy(part)})
        else:
            out.append({"type": "response.function_call_arguments.done", "item_id": item["id"],
                        "output_index": index, "name": item["name"], "arguments": item["arguments"]})
        item["status"] = status
        out.append({"type": "response.output_item.done", "output_index": index, "item": copy.deepcopy(item)})
