"""One call object, `{"name": "f", "arguments": {...}}`, scanned a character at a time as the
model writes it (every JSON format shares it: hermes, llama3_json, the required choice).

The object's own level is read strictly: keys, colons, commas. The name must be a JSON string
naming one of the request's tools; the call starts (CallStart) as soon as it is known. The
arguments ("arguments" or "parameters", the first of them) are streamed as the exact text of
their JSON value, character for character as written: the pieces add up to the value. Inside
a value only strings and bracket depth are tracked (the value's end is found, its grammar is
not checked). Arguments written before the name are held until the name comes. A missing
arguments key gives "{}".

Status: RUNNING, DONE (the closing brace consumed) or FAILED (at a character that breaks the
object's own level, not consumed; or the object ends without a known name). `started` says
whether the CallStart went out: a call that fails before it is not a call at all."""

from __future__ import annotations

import json

from scheduler_svc.api.tools.events import CallArgs, CallStart, Event

RUNNING, DONE, FAILED = "running", "done", "failed"
ARGS_KEYS = ("arguments", "parameters")  # hermes writes the first, llama 3 the second
_WS = " \t\r\n"
_PRIMITIVE_START = set("-0123456789tfn")
_SKIP, _NAME, _ARGS = 0, 1, 2  # what a value of the object's level is


class _Value:
    """The end of one JSON value: strings (with escapes) and bracket depth."""

    __slots__ = ("kind", "depth", "in_str", "esc")

    def __init__(self, first: str):
        self.kind = "str" if first == '"' else "box" if first in "{[" else "prim"
        self.depth, self.in_str, self.esc = (1 if self.kind == "box" else 0), self.kind == "str", False

    def step(self, c: str) -> tuple[bool, bool]:
        """(c is part of the value, the value is complete)."""
        if self.in_str:
            if self.esc:
                self.esc = False
            elif c == "\\":
                self.esc = True
            elif c == '"':
                self.in_str = False
                return True, self.kind == "str"
            return True, False
        if self.kind == "prim":
            if c in _WS or c in ",}]":
                return False, True  # the terminator belongs to the enclosing level
            return True, False
        if c == '"':
            self.in_str = True
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1
            return True, self.depth == 0
        return True, False


class CallScanner:
    def __init__(self, names: frozenset[str], index: int):
        self.names, self.index = names, index
        self.status, self.started = RUNNING, False
        self._state = "open"
        self._key: list[str] = []
        self._key_text = ""
        self._name: list[str] | None = None
        self._value: _Value | None = None
        self._what = _SKIP
        self._args_seen = False
        self._args: list[str] = []  # arguments not yet out

    def feed(self, text: str, out: list[Event]) -> int:
        """Scans `text`, appending events to `out`; returns how many characters it consumed
        (all of them while RUNNING)."""
        for i, c in enumerate(text):
            if not self._step(c, out):
                self.status = FAILED
                self._flush(out)
                return i
            if self.status == DONE:
                self._flush(out)
                return i + 1
        self._flush(out)
        return len(text)

    def _flush(self, out: list[Event]) -> None:
        if self.started and self._args:
            out.append(CallArgs(self.index, "".join(self._args)))
            self._args.clear()

    def _step(self, c: str, out: list[Event]) -> bool:
        state = self._state
        if state == "value":
            return self._value_char(c, out)
        if state == "key":
            if self._value is None:
                self._value = _Value('"')
                return True
            self._key.append(c)
            if not self._value.step(c)[1]:
                return True
            self._key_text, self._value, self._state = _string(self._key), None, "colon"
            self._key.clear()
            return self._key_text is not None
        if c in _WS:
            return True
        if state == "open":
            self._state = "key_or_end"
            return c == "{"
        if state in ("key_or_end", "after"):
            if c == "}":
                return self._close(out)
            if state == "after":
                self._state = "key_or_end"
                return c == ","
            self._state = "key"
            return c == '"' and self._step(c, out)
        if state == "colon":
            self._state = "value_start"
            return c == ":"
        # value_start: the value's first character
        key, what = self._key_text, _SKIP
        if key == "name" and self._name is None:
            if c != '"':
                return False
            self._name, what = [], _NAME
        elif key in ARGS_KEYS and not self._args_seen:
            self._args_seen, what = True, _ARGS
            self._args.append(c)
        elif not (c == '"' or c in "{[" or c in _PRIMITIVE_START):
            return False
        self._what, self._value, self._state = what, _Value(c), "value"
        return True

    def _value_char(self, c: str, out: list[Event]) -> bool:
        part, complete = self._value.step(c)
        if part:
            if self._what == _NAME:
                self._name.append(c)
            elif self._what == _ARGS:
                self._args.append(c)
        if complete:
            self._state, self._value = "after", None
            if self._what == _NAME and not self._start(out):
                return False
            if not part:
                return self._step(c, out)  # the terminator, at the object's level
        return True

    def _start(self, out: list[Event]) -> bool:
        name = _string(self._name)
        if name not in self.names:
            return False
        self.started = True
        out.append(CallStart(self.index, name))
        self._flush(out)
        return True

    def _close(self, out: list[Event]) -> bool:
        if not self.started:
            return False
        if not self._args_seen:
            self._args.append("{}")
        self.status = DONE
        return True


def _string(chars: list[str]) -> str | None:
    """A JSON string's value from its characters after the opening quote; None if invalid."""
    try:
        return json.loads('"' + "".join(chars))
    except ValueError:
        return None
