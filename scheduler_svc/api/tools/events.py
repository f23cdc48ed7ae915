"""What a tool-call parser makes of the model's text, in the order the text came: content, the
start of a call (its name), fragments of a call's arguments. Every parser is a stream parser
(`feed` each new piece of text, `finish` once at the end); a whole text is parsed by feeding it
in one piece, so a streamed response always adds up to the one collected."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int  # 0, 1, ... in the order the calls start
    name: str


@dataclass(frozen=True)
class CallArgs:
    index: int
    text: str  # the next piece of the call's arguments (JSON text)


Event = Content | CallStart | CallArgs


class StreamParser(Protocol):
    def feed(self, text: str) -> list[Event]: ...

    def finish(self) -> list[Event]: ...


class ModeParser:
    """A stream parser as a state machine: `_mode` names the method (`_<mode>(text, out)`)
    that takes the next text and returns what it left for the next mode. `finish` releases
    what is held (`_release`), then every later text is dropped."""

    _mode = "done"

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        while text:
            text = getattr(self, "_" + self._mode)(text, out)
        return out

    def finish(self) -> list[Event]:
        out: list[Event] = []
        self._release(out)
        self._mode = "done"
        return out

    def _release(self, out: list[Event]) -> None:
        pass

    def _done(self, text: str, out: list[Event]) -> str:
        return ""


@dataclass
class Parsed:
    """A whole output: its content ("" when none) and its calls as [name, arguments] pairs."""

    content: str
    calls: list[list[str]]


def parse_all(parser: StreamParser, text: str) -> Parsed:
    return gather(parser.feed(text) + parser.finish())


def gather(events: list[Event]) -> Parsed:
    content, calls = [], {}
    for e in events:
        if isinstance(e, Content):
            content.append(e.text)
        elif isinstance(e, CallStart):
            calls[e.index] = [e.name, ""]
        else:
            calls[e.index][1] += e.text
    return Parsed("".join(content), [calls[i] for i in sorted(calls)])


def longest_prefix_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper start of `tag` (held back: it may
    become the tag)."""
    for k in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0
