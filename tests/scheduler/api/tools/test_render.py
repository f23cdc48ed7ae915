"""Chats with tools through chat templates: the built-in model's (SmolLM2's renders no tools:
the tools described in the system message, hermes style, calls and results in the turns), and
a template that renders tools, given them as transformers' apply_chat_template gives them."""

import json
import shutil

import pytest

from scheduler_svc.api.tools.hermes import HermesFormat
from scheduler_svc.api.tools.llama3_json import Llama3JsonFormat
from scheduler_svc.api.tools.render import ToolChatPrompt, ToolTurn, renders_tools
from scheduler_svc.core.tokenizer import Tokenizer

TOOLS = ({"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},)
TURNS = [ToolTurn("user", "Weather in Paris?"),
         ToolTurn("assistant", "", (("call_1", "get_weather", '{"city": "Paris"}'),)),
         ToolTurn("tool", "20C", tool_call_id="call_1"), ToolTurn("tool", "sunny", tool_call_id="call_1")]

# Qwen2.5's way, shortened: the tools in the system turn, calls as hermes blocks, results in a user turn
NATIVE_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:{% for t in tools %}\n{{ t | tojson }}{% endfor %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response id={{ m.tool_call_id }}>{{ m.content }}</tool_response><|im_end|>\n"
    "{%- elif m.tool_calls %}<|im_start|>assistant\n{{ m.content }}{% for c in m.tool_calls %}<tool_call>"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</tool_call>{% endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def smol(smollm2_folder):
    return Tokenizer(smollm2_folder)


def test_builtin_template_renders_no_tools_so_they_are_described(smol):
    assert not renders_tools(smol.chat_template)
    text = ToolChatPrompt(TURNS, True, TOOLS, HermesFormat).render(smol)
    tools_json = json.dumps(TOOLS[0])
    assert text == (
        f"<|im_start|>system\n{HermesFormat.system_prompt(list(TOOLS))}<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n20C\n</tool_response>\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")
    assert f"<tools>\n{tools_json}\n</tools>" in text


def test_described_tools_join_the_clients_system_message(smol):
    turns = [ToolTurn("system", "Be brief."), ToolTurn("user", "Hi")]
    text = ToolChatPrompt(turns, True, TOOLS, Llama3JsonFormat).render(smol)
    assert text.startswith(f"<|im_start|>system\nBe brief.\n\n{Llama3JsonFormat.system_prompt(list(TOOLS))}<|im_end|>\n"
                           "<|im_start|>user\nHi<|im_end|>\n")
    assert "You are a helpful AI assistant named SmolLM" not in text  # the template's own default


def test_history_without_tools_is_rendered_without_a_tools_prompt(smol):
    turns = [ToolTurn("user", "Hi"), ToolTurn("assistant", "Checking.", (("c", "get_time", "not json"),)),
             ToolTurn("tool", "noon", tool_call_id="c"), ToolTurn("user", "Thanks")]
    text = ToolChatPrompt(turns, False, (), HermesFormat).render(smol)
    assert "# Tools" not in text and "You are a helpful AI assistant named SmolLM" in text
    assert ('<|im_start|>assistant\nChecking.\n<tool_call>\n{"name": "get_time", "arguments": "not json"}\n'
            "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nnoon\n</tool_response><|im_end|>\n"
            "<|im_start|>user\nThanks<|im_end|>\n") in text


@pytest.fixture(scope="module")
def native_folder(tmp_path_factory):
    from executor_svc.model_loader.random_model import build_tokenizer

    folder = tmp_path_factory.mktemp("native-tools")
    build_tokenizer(folder, vocab_size=512, max_model_len=2048)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": NATIVE_TEMPLATE}))
    return folder


def test_a_template_that_renders_tools_gets_them_as_transformers_gives_them(native_folder, tmp_path):
    from transformers import AutoTokenizer

    ours = Tokenizer(native_folder)
    assert renders_tools(ours.chat_template)
    hf_messages = [{"role": "user", "content": "Weather in Paris?"},
                   {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
                       "name": "get_weather", "arguments": {"city": "Paris"}}}]},
                   {"role": "tool", "content": "20C", "tool_call_id": "call_1"},
                   {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}]
    shutil.copytree(native_folder, tmp_path / "hf")
    hf = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    expected = hf.apply_chat_template(hf_messages, tools=list(TOOLS), tokenize=False, add_generation_prompt=True)
    text = ToolChatPrompt(TURNS, True, TOOLS, HermesFormat).render(ours)
    assert text == expected
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in text
    assert "<tool_response id=call_1>20C</tool_response>" in text and text.count('"name": "get_weather"') == 2
    no_tools = ToolChatPrompt(TURNS[:1], True, (), HermesFormat).render(ours)
    assert no_tools == hf.apply_chat_template(hf_messages[:1], tokenize=False, add_generation_prompt=True)


def test_renders_tools_reads_the_template():
    assert renders_tools("{% for t in tools %}{{ t }}{% endfor %}")
    assert not renders_tools("{{ messages[0]['content'] }}") and not renders_tools(None)
    assert not renders_tools("{% if %}")  # not a template
