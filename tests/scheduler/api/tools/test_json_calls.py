"""The llama3_json parser and the forced choices' parsers (required: an array of calls; named:
the arguments alone): exact outputs, the same for every cut into streamed pieces."""

import json

import pytest

from scheduler_svc.api.tools.events import CallArgs, CallStart, Content, parse_all
from scheduler_svc.api.tools.forced import NamedParser, required_parser
from scheduler_svc.api.tools.llama3_json import Llama3JsonFormat, llama3_parser
from tests.scheduler.api.tools.chunking import check_every_cut, cuts, streamed

NAMES = frozenset({"get_weather", "get_time"})

LLAMA3 = {
    "one call": ('{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [["get_weather", '{"city": "Paris"}']]),
    "two calls, python tag": ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
                              '{"name": "get_time", "arguments": {"tz": "CET"}}',
                              "", [["get_weather", '{"city": "Paris"}'], ["get_time", '{"tz": "CET"}']]),
    "leading whitespace, text after": ('\n {"name": "get_time", "parameters": {}}\nIt is noon.', "It is noon.",
                                       [["get_time", "{}"]]),
    "content": ("The weather is fine {not a call}", "The weather is fine {not a call}", []),
    "JSON that is not a call": (' {"city": "Paris"}', ' {"city": "Paris"}', []),
    "unknown function": ('{"name": "nope", "parameters": {}}', '{"name": "nope", "parameters": {}}', []),
    "a second object that is not a call": ('{"name": "get_time", "parameters": {}}; {"x": 1}', '{"x": 1}',
                                           [["get_time", "{}"]]),
    "python tag alone": ("<|python_tag|>", "<|python_tag|>", []),
    "almost the tag": ("<|python_ta!", "<|python_ta!", []),
    "whitespace": ("  \n", "  \n", []),
}

REQUIRED = {
    "two calls": ('[{"name": "get_time", "parameters": {"tz": "UTC"}}, {"name": "get_weather", "parameters": '
                  '{"city": "Rome", "days": [1, 2]}}]',
                  "", [["get_time", '{"tz": "UTC"}'], ["get_weather", '{"city": "Rome", "days": [1, 2]}']]),
    "compact": ('[{"name":"get_time","parameters":{}}]', "", [["get_time", "{}"]]),
    "spaced": ('  [ {"name": "get_time", "parameters": {"x": "]"}} ] ', "", [["get_time", '{"x": "]"}']]),
}


@pytest.mark.parametrize("parser, case", [pytest.param(p, cases[n], id=f"{p.__name__}: {n}")
                                          for p, cases in ((llama3_parser, LLAMA3), (required_parser, REQUIRED))
                                          for n in sorted(cases)])
def test_every_cut(parser, case):
    check_every_cut(lambda: parser(NAMES), *case)


def test_llama3_holds_only_a_possible_start_and_streams_the_call():
    parser = llama3_parser(NAMES)
    assert parser.feed(" ") == [] and parser.feed("<|pyth") == []
    assert parser.feed("on_tag|>") == [] and parser.feed('{"name": "get_time", "para') == [CallStart(0, "get_time")]
    assert parser.feed('meters": {"tz"') == [CallArgs(0, '{"tz"')]
    assert parser.feed(': "CET"}}') == [CallArgs(0, ': "CET"}')]
    text = llama3_parser(NAMES)
    assert text.feed(" Sure") == [Content(" Sure")]  # not a call: out at once, as written
    assert text.feed(" {") == [Content(" {")]


def test_named_choice_output_is_the_arguments():
    for pieces in cuts('{"city": "Paris", "days": 3}'):
        parsed, events = streamed(lambda: NamedParser("get_weather"), pieces)
        assert parsed.calls == [["get_weather", '{"city": "Paris", "days": 3}']] and parsed.content == ""
        assert events[0] == CallStart(0, "get_weather")
    assert parse_all(NamedParser("get_time"), "").calls == [["get_time", "{}"]]


def test_llama3_prompt_text():
    tools = [{"type": "function", "function": {"name": "get_time"}}]
    assert '"name": "get_time"' in Llama3JsonFormat.system_prompt(tools)
    calls = Llama3JsonFormat.render_calls([("get_time", "{}"), ("get_weather", '{"city": "Paris"}')])
    assert calls == '{"name": "get_time", "parameters": {}}; {"name": "get_weather", "parameters": {"city": "Paris"}}'
    assert [json.loads(part) for part in calls.split("; ")][1]["parameters"] == {"city": "Paris"}
    assert parse_all(llama3_parser(NAMES), calls).calls == [["get_time", "{}"], ["get_weather", '{"city": "Paris"}']]
