"""The hermes parser: exact content and calls of whole texts, the same for every way the text
is cut into streamed pieces, and what it holds back while streaming."""

import pytest

from scheduler_svc.api.tools.events import CallArgs, CallStart, Content, parse_all
from scheduler_svc.api.tools.hermes import HermesFormat, HermesParser
from tests.scheduler.api.tools.chunking import check_every_cut, content_events

NAMES = frozenset({"get_weather", "get_time"})

CASES = {
    "one call": ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
                 "", [["get_weather", '{"city": "Paris"}']]),
    "content then two calls": (
        'Let me check.\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par}is", '
        '"days": [1, 2], "q": "a \\"quoted\\" }"}}\n</tool_call>\n<tool_call>{"arguments":{"tz":"CET"},'
        '"name":"get_time"}</tool_call>\n',
        "Let me check.",
        [["get_weather", '{"city": "Par}is", "days": [1, 2], "q": "a \\"quoted\\" }"}'],
         ["get_time", '{"tz":"CET"}']]),
    "content after a call": ('<tool_call>{"name": "get_time"}</tool_call>\n  Done, it is noon. ',
                             "Done, it is noon. ", [["get_time", "{}"]]),
    "no closing tag": ('<tool_call>{"name": "get_time", "arguments": {}}', "", [["get_time", "{}"]]),
    "cut short": ('<tool_call>{"name": "get_weather", "arguments": {"city": "Pa', "",
                  [["get_weather", '{"city": "Pa']]),
    "an escaped quote before a brace": ('<tool_call>{"name": "get_time", "arguments": {"q": "x \\" }", "r": "\\\\"}}'
                                        "</tool_call>", "", [["get_time", '{"q": "x \\" }", "r": "\\\\"}']]),
    "escaped name, primitive arguments": ('<tool_call>{"name": "get_\\u0074ime", "arguments": 7 }</tool_call>',
                                          "", [["get_time", "7"]]),
    "plain text": ("Hello, world.\n\nNo calls here <b>bold</b> < tool_call >\n", "Hello, world.\n\nNo calls "
                   "here <b>bold</b> < tool_call >\n", []),
    "a tag start that is not one": ("a <tool_ b <tool_callx", "a <tool_ b <tool_callx", []),
    "unknown function: content as written": (
        'x\n<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call> y',
        'x\n<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call> y', []),
    "not JSON: content as written": ("<tool_call>\nget_time()\n</tool_call>", "<tool_call>\nget_time()\n</tool_call>", []),
    "a bad block, then a call": ('<tool_call>[1]</tool_call>\n<tool_call>{"name": "get_time", "arguments": {"a": null}}'
                                 "</tool_call>", "<tool_call>[1]</tool_call>", [["get_time", '{"a": null}']]),
    "a broken call keeps what it had": ('<tool_call>{"name": "get_time", "arguments": {"a": 1} ?? }</tool_call>ok',
                                        "ok", [["get_time", '{"a": 1}']]),
    "unicode": ('Voilà 🚀<tool_call>{"name": "get_weather", "arguments": {"city": "Zürich 日本"}}</tool_call>',
                "Voilà 🚀", [["get_weather", '{"city": "Zürich 日本"}']]),
    "empty": ("", "", []),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_whole_text(name):
    text, content, calls = CASES[name]
    parsed = parse_all(HermesParser(NAMES), text)
    assert (parsed.content, parsed.calls) == (content, calls)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_cut_streams_the_same(name):
    check_every_cut(lambda: HermesParser(NAMES), *CASES[name])


def test_a_call_starts_with_its_name_then_streams_its_arguments():
    parser = HermesParser(NAMES)
    assert parser.feed("Hi <tool_") == [Content("Hi")]
    assert parser.feed('call>\n{"name": "get_wea') == []
    assert parser.feed('ther", "arguments": {"ci') == [CallStart(0, "get_weather"), CallArgs(0, '{"ci')]
    assert parser.feed('ty": "Paris"}') == [CallArgs(0, 'ty": "Paris"}')]
    assert parser.feed("}\n</tool_call>\n<tool_call>") == []
    assert parser.feed('{"arguments": {"tz": 1}, "name": "get_time"}') == [
        CallStart(1, "get_time"), CallArgs(1, '{"tz": 1}')]
    assert parser.finish() == []


@pytest.mark.parametrize("text, out, held", [
    ("Hello", "Hello", ""), ("Hello <", "Hello", " <"), ("Hello <tool_cal", "Hello", " <tool_cal"),
    ("a<t", "a", "<t"), ("a <x", "a <x", ""), ("line\n\n", "line", "\n\n"), ("<tool_call", "", "<tool_call"),
    ("x </tool_call>", "x </tool_call>", ""),
])
def test_holds_back_only_a_possible_tag_start(text, out, held):
    parser = HermesParser(NAMES)
    assert "".join(content_events(parser.feed(text))) == out
    assert "".join(content_events(parser.finish())) == held  # released when the text ends


def test_prompt_text():
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    system = HermesFormat.system_prompt(tools)
    assert '<tools>\n{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}\n</tools>' in system
    assert '{"name": <function-name>, "arguments": <args-json-object>}' in system
    call = HermesFormat.render_calls([("get_time", '{"tz": "CET"}')])
    assert call == '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>'
    assert parse_all(HermesParser(NAMES), call).calls == [["get_time", '{"tz": "CET"}']]  # reads its own
    assert HermesFormat.render_results(["a", "b"]) == "<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response>"
