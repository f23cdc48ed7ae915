"""Feeding a stream parser a text in pieces: every way a test cuts it (one piece, each
character, every cut in two, random cuts), and what the pieces' events add up to."""

from __future__ import annotations

import random

from scheduler_svc.api.tools.events import Content, Parsed, gather


def cuts(text: str, num_random: int = 60):
    """Piece lists of `text`: whole, character by character, every cut in two, random cuts."""
    yield [text]
    yield list(text)
    for i in range(1, len(text)):
        yield [text[:i], text[i:]]
    rng = random.Random(len(text))
    for _ in range(num_random):
        pieces, i = [], 0
        while i < len(text):
            k = rng.randint(1, 7)
            pieces.append(text[i:i + k])
            i += k
        yield pieces


def streamed(new_parser, pieces: list[str]) -> tuple[Parsed, list]:
    """(what the events add up to, the events) of feeding `pieces` then finishing."""
    parser, events = new_parser(), []
    for piece in pieces:
        events += parser.feed(piece)
    events += parser.finish()
    return gather(events), events


def content_events(events) -> list[str]:
    return [e.text for e in events if isinstance(e, Content)]


def check_every_cut(new_parser, text: str, content: str, calls: list) -> None:
    """Every cut of `text` streams to exactly `content` and `calls`, and no piece of a tag of a
    call goes out as content."""
    for pieces in cuts(text):
        parsed, events = streamed(new_parser, pieces)
        assert (parsed.content, parsed.calls) == (content, calls), pieces
        if calls and "<tool_call>" not in content:
            assert not any("<tool" in t or "</tool" in t for t in content_events(events)), pieces
