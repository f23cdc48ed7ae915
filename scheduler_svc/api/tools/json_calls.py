"""Calls written as bare JSON objects at the very start of the output, one after another:
llama3_json's `{"name": ..., "parameters": ...}; {...}` (after an optional `<|python_tag|>`)
and the required tool choice's array `[{"name": ..., "parameters": ...}, ...]` (forced.py).

An output that does not start so (after whitespace) is content, exactly as written: held back
only while it might still start so. An object that is not a call of one of the request's tools
makes it and everything after it content, as written; text after the last call is content."""

from __future__ import annotations

from scheduler_svc.api.tools.events import Content, Event, ModeParser
from scheduler_svc.api.tools.scan import DONE, FAILED, CallScanner


class JsonCallsParser(ModeParser):
    """`prefix`: an optional text before the calls; `opener`/`closer`: a required bracket around
    them ("" = none); `separator` between two calls."""

    def __init__(self, names: frozenset[str], prefix: str = "", opener: str = "",
                 separator: str = ";", closer: str = ""):
        self.names, self.prefix, self.opener = names, prefix, opener
        self.separator, self.closer = separator, closer
        self._mode = "start"  # start, call, between, content, done
        self._held = ""  # text not out yet: the start, or the call not yet started
        self._scanner: CallScanner | None = None
        self._num_calls = 0

    def _release(self, out: list[Event]) -> None:
        if self._held and (self._mode == "start" or (self._mode == "call" and not self._scanner.started)):
            out.append(Content(self._held))

    def _start(self, text: str, out: list[Event]) -> str:
        """Whitespace, the prefix if any, the opener, whitespace: then a call or content."""
        self._held += text
        rest = self._held.lstrip()
        for part in (self.prefix, self.opener):
            if not part:
                continue
            if rest.startswith(part):
                rest = rest[len(part):].lstrip()
            elif part.startswith(rest):  # (also rest == "")
                return ""
            elif part == self.opener:
                return self._as_content(out)
        if not rest:
            return ""
        if rest[0] != "{":
            return self._as_content(out)
        return self._begin(len(self._held) - len(rest))

    def _begin(self, keep: int) -> str:
        """A call's object starts after the first `keep` characters held."""
        rest, self._held = self._held[keep:], self._held[:keep]
        self._scanner = CallScanner(self.names, self._num_calls)
        self._mode = "call"
        return rest

    def _as_content(self, out: list[Event]) -> str:
        out.append(Content(self._held))
        self._held, self._mode = "", "content"
        return ""

    def _call(self, text: str, out: list[Event]) -> str:
        scanner = self._scanner
        n = scanner.feed(text, out)
        if scanner.status == FAILED and not scanner.started:  # not a call: content from here on
            self._held += text
            return self._as_content(out)
        if not scanner.started:
            self._held += text[:n]
        if scanner.status == DONE:
            self._num_calls += 1
            self._held, self._mode = "", "between"
        elif scanner.status == FAILED:
            self._num_calls += 1
            self._held, self._mode = "", "done"
        return text[n:]

    def _between(self, text: str, out: list[Event]) -> str:
        self._held += text
        rest = self._held.lstrip()
        if not rest:
            return ""
        if self.closer and rest.startswith(self.closer):
            self._held, self._mode = "", "done"
            return ""
        if rest.startswith(self.separator):
            rest = rest[len(self.separator):]
            self._held = rest
            if not rest.lstrip():
                return ""
            rest = rest.lstrip()
        if rest[0] == "{":
            self._held = rest
            return self._begin(0)
        self._held = rest
        return self._as_content(out)

    def _content(self, text: str, out: list[Event]) -> str:
        out.append(Content(text))
        return ""

