"""Tool calling's flags: vLLM's names on the scheduler (and its LLMSERVE_SCHEDULER_ variables),
checked at start, passed on by the launcher when given, and read into the HTTP door's settings."""

import pytest

from llmserve.flags import commands, parse_args
from scheduler_svc.api.tools.plan import ToolSettings
from scheduler_svc.config import from_args


def test_the_scheduler_reads_them():
    config = from_args(["--enable-auto-tool-choice", "--tool-call-parser", "llama3_json"])
    assert ToolSettings.from_config(config) == ToolSettings(auto=True, parser="llama3_json")
    assert ToolSettings.from_config(from_args([])) == ToolSettings(auto=False, parser="")
    assert from_args(["--tool-call-parser", "hermes"]).tool_call_parser == "hermes"  # (none and required)


def test_and_from_the_environment(monkeypatch):
    monkeypatch.setenv("LLMSERVE_SCHEDULER_ENABLE_AUTO_TOOL_CHOICE", "1")
    monkeypatch.setenv("LLMSERVE_SCHEDULER_TOOL_CALL_PARSER", "hermes")
    assert ToolSettings.from_config(from_args([])) == ToolSettings(auto=True, parser="hermes")


@pytest.mark.parametrize("argv, words", [
    (["--enable-auto-tool-choice"], "--enable-auto-tool-choice needs --tool-call-parser"),
    (["--tool-call-parser", "pythonic"], "must be one of hermes, llama3_json"),
])
def test_a_bad_combination_stops_the_start(argv, words, capsys):
    with pytest.raises(SystemExit):
        from_args(argv)
    assert words in capsys.readouterr().err


def test_the_launcher_passes_them_on():
    _, scheduler = commands(parse_args(["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]), http_api=True)
    assert scheduler[-3:] == ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    _, plain = commands(parse_args([]), http_api=True)
    assert "--enable-auto-tool-choice" not in plain and "--tool-call-parser" not in plain
