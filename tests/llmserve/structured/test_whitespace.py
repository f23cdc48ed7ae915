"""JSON's flexible whitespace (the default): compact, spaced and pretty-printed JSON pass, but a
place between two tokens holds at most one space, or one newline and an indent of 20 spaces or
tabs, so a model cannot spend max_tokens on whitespace. With the earlier 64 characters of any
whitespace a place, SmolLM2 at temperature 1 filled 3 in 10 arrays of 3 booleans with newlines
past 200 tokens (tests/integration/test_structured_model.py runs the corpus on it)."""

from __future__ import annotations

import json

import pytest

from llmserve.structured import constraint as sc

NESTED = {"type": "object", "properties": {
    "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "integer"}},
    "inner": {"type": "object", "properties": {"ok": {"type": "boolean"}, "deeper": {"type": "object"}}}}}
VALUE = {"name": "Ada", "tags": [1, 2], "inner": {"ok": True, "deeper": {"x": [None, {"y": 1.5}]}}}


def _accepts(tiny, compiler, constraint: sc.Constraint, text: str) -> bool:
    """The grammar takes the whole text, and may end there."""
    m = compiler.compile(constraint).matcher()
    return m.consume(tiny.encode(text, add_special_tokens=False)) and m.is_accepting()


@pytest.mark.parametrize("dumps", [
    {"separators": (",", ":")}, {}, {"indent": 2}, {"indent": 4}, {"indent": "\t"}],
    ids=["compact", "spaced", "indent2", "indent4", "tabs"])
def test_usual_json_layouts_pass(tiny, tiny_compiler, dumps):
    text = json.dumps(VALUE, **dumps)
    assert _accepts(tiny, tiny_compiler, sc.json_schema(NESTED, "json"), text), text


@pytest.mark.parametrize("text", [
    '[\n\ntrue]',  # a blank line
    '[' + '\n' * 64 + 'true]',  # what SmolLM2 wrote at temperature 1
    '[  true]',  # two spaces
    '[true ,  false]',
    '[\n' + ' ' * 21 + 'true]',  # an indent past 20
    '[ \ntrue]',  # a space, then a newline
])
def test_runs_of_whitespace_are_refused(tiny, tiny_compiler, text):
    schema = {"type": "array", "items": {"type": "boolean"}}
    assert not _accepts(tiny, tiny_compiler, sc.json_schema(schema, "json"), text)
    assert _accepts(tiny, tiny_compiler, sc.json_schema(schema, "json", whitespace_pattern=r"[ \n]+"), text)


def test_an_indent_of_20_and_compact_are_the_bounds(tiny, tiny_compiler):
    schema = sc.json_schema({"type": "array", "items": {"type": "boolean"}}, "json")
    assert _accepts(tiny, tiny_compiler, schema, '[\n' + '\t' * 20 + 'true,\n' + ' ' * 20 + 'false\n]')
    compact = sc.json_schema({"type": "array", "items": {"type": "boolean"}}, "json", whitespace="compact")
    assert _accepts(tiny, tiny_compiler, compact, "[true,false]")
    assert not _accepts(tiny, tiny_compiler, compact, "[true, false]")
