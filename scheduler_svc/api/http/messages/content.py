"""A message's content blocks, built from what the model writes as the tool-call parser reads
it (api/tools/events.py: content, the start of a call, pieces of its arguments), and the
stream events Anthropic sends for each step.

Content goes into `text` blocks; each call is a `tool_use` block of its own (`toolu_…` id,
`name`, `input`), in the order written. A block is opened (`content_block_start`, a text
block with empty text, a tool_use block with input {}), grows by deltas (`text_delta`,
`input_json_delta` with the arguments as the model writes them) and is closed when the next
block starts or the output ends (`content_block_stop`); then a tool_use block's `input` is its
arguments parsed: a JSON object, or {} when they are not one (a call cut short by max_tokens;
the stream has carried them as written). A model that writes nothing gives no block. The
collected message is the same builder with its events dropped, so a stream always adds up to
the collected content."""

from __future__ import annotations

import json
import uuid

from scheduler_svc.api.tools.events import CallArgs, CallStart, Content, Event


def tool_use_id() -> str:
    return "toolu_" + uuid.uuid4().hex[:24]


def arguments_object(arguments: str) -> dict:
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class ContentBlocks:
    """The content of one message. `parallel` false keeps the first call only."""

    def __init__(self, parallel: bool = True):
        self.blocks: list[dict] = []  # as the message's `content`
        self._open: int | None = None  # the index of the block being written
        self._calls: dict[int, int] = {}  # the parser's call index -> its block's index
        self._arguments: dict[int, str] = {}  # a tool_use block's index -> its arguments text
        self._parallel = parallel

    @property
    def called(self) -> bool:
        return bool(self._calls)

    def add(self, events: list[Event]) -> list[dict]:
        """The stream events of one engine output's parsed events."""
        out: list[dict] = []
        for e in events:
            if isinstance(e, Content):
                if e.text:
                    self._text(e.text, out)
            elif isinstance(e, CallStart):
                if self._parallel or e.index == 0:
                    self._start(e, out)
            elif isinstance(e, CallArgs) and self._open is not None and self._calls.get(e.index) == self._open:
                self._arguments[self._open] += e.text  # (a call dropped by parallel false has no block)
                out.append({"type": "content_block_delta", "index": self._open,
                            "delta": {"type": "input_json_delta", "partial_json": e.text}})
        return out

    def finish(self) -> list[dict]:
        """Closes the content; its last events."""
        out: list[dict] = []
        self._close(out)
        return out

    def _added(self, block: dict, start: dict, out: list[dict]) -> None:
        self._close(out)
        self._open = len(self.blocks)
        self.blocks.append(block)
        out.append({"type": "content_block_start", "index": self._open, "content_block": start})

    def _text(self, text: str, out: list[dict]) -> None:
        if self._open is None or self.blocks[self._open]["type"] != "text":
            self._added({"type": "text", "text": ""}, {"type": "text", "text": ""}, out)
        self.blocks[self._open]["text"] += text
        out.append({"type": "content_block_delta", "index": self._open,
                    "delta": {"type": "text_delta", "text": text}})

    def _start(self, e: CallStart, out: list[dict]) -> None:
        block = {"type": "tool_use", "id": tool_use_id(), "name": e.name, "input": {}}
        self._added(block, dict(block, input={}), out)
        self._calls[e.index] = self._open
        self._arguments[self._open] = ""

    def _close(self, out: list[dict]) -> None:
        index, self._open = self._open, None
        if index is None:
            return
        if index in self._arguments:
            self.blocks[index]["input"] = arguments_object(self._arguments[index])
        out.append({"type": "content_block_stop", "index": index})
