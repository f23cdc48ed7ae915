"""Tokenizer and detokenizer against transformers' AutoTokenizer on a generated model folder."""

import json
import shutil

import jinja2
import pytest

from scheduler_svc.core.detokenizer import IncrementalDetokenizer
from scheduler_svc.core.request import FinishReason
from scheduler_svc.core.scheduler import Scheduler
from scheduler_svc.core.tokenizer import Tokenizer
from tests.scheduler.sched_driver import make_config, req

TEXTS = ["Hello, world!", "The quick brown fox", "Unicode: café, naïve, 日本語, emoji 🚀",
         "  leading spaces\nand lines\n\n", "<|bos|> special in text <|eos|>", ""]
CHATS = [
    [{"role": "user", "content": "Hi é 🚀"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"},
     {"role": "assistant", "content": "Hi!"}, {"role": "user", "content": "日本語?"}],
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from executor_svc.model_loader.random_model import build_random_model  # imports torch: fine in tests

    return build_random_model(tmp_path_factory.mktemp("model"), "tiny-llama")


@pytest.fixture(scope="module")
def tok(folder):
    return Tokenizer(folder)


@pytest.fixture(scope="module")
def hf(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encode_and_decode_match_transformers(tok, hf, add_special_tokens):
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=add_special_tokens)
        assert ids == hf(text, add_special_tokens=add_special_tokens)["input_ids"], text
        assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    assert tok.encode("x")[0] == tok.bos_token_id == hf.bos_token_id  # BOS from the post-processor


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(tok, hf, add_generation_prompt):
    for chat in CHATS:
        text = tok.render_chat(chat, add_generation_prompt=add_generation_prompt)
        assert text == hf.apply_chat_template(chat, add_generation_prompt=add_generation_prompt,
                                              tokenize=False)
        ids = tok.apply_chat_template(chat, add_generation_prompt=add_generation_prompt)
        expected = hf.apply_chat_template(chat, add_generation_prompt=add_generation_prompt)
        assert ids == list(getattr(expected, "input_ids", None) or expected["input_ids"])
        assert ids.count(tok.bos_token_id) == 1  # the template's BOS only, none added twice


def test_special_ids_and_vocab(tok, hf):
    assert tok.eos_token_ids == (hf.eos_token_id,)
    assert tok.vocab_size == len(hf) == 512
    assert tok.id_to_token(tok.bos_token_id) == "<|bos|>" and tok.id_to_token(10**6) is None


def test_template_runs_sandboxed_with_raise_exception(folder, tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(folder / name, tmp_path / name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
        "{{ eos_token }}{{ messages[0]['content'] | tojson }}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = Tokenizer.from_pretrained(tmp_path)
    assert tok.render_chat([{"role": "user", "content": "é"}]) == '<|eos|>"é"'
    with pytest.raises(jinja2.TemplateError, match="user first"):
        tok.render_chat([{"role": "system", "content": "x"}])
    config["chat_template"] = "{{ messages.__class__.__mro__ }}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(jinja2.exceptions.SecurityError):
        Tokenizer(tmp_path).render_chat([])


def test_streamed_pieces_are_whole_characters(tok):
    text = "Hi é 日本語 🚀 über café, naïve 🚀🚀"
    ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_ids[0]]
    detok = IncrementalDetokenizer(tok, tok.encode("Prompt: "))
    pieces = [detok.step(i) for i in ids]
    assert "".join(pieces) == tok.decode(ids) == text
    assert not any("\ufffd" in p for p in pieces)
    assert pieces.count("") >= 5  # multi-byte characters really were split across tokens
    assert {"é", "日本語", "🚀"} <= set(pieces)


def test_ids_without_a_token_produce_no_text(tok):
    detok = IncrementalDetokenizer(tok, [])
    ids = tok.encode("日本", add_special_tokens=False)
    pieces = [detok.step(ids[0]), detok.step(10**6), *[detok.step(i) for i in ids[1:]]]
    assert "".join(pieces) == "日本" and pieces[1] == ""


def test_scheduler_streams_text_and_cuts_stop_strings(tok):
    s = Scheduler(make_config(eos_token_ids=tok.eos_token_ids), tok)  # a Tokenizer as factory
    s.add_request(req(0, tok.encode("Q:"), max_tokens=50, stop=("語 🚀",)))
    s.add_request(req(1, tok.encode("Q:"), max_tokens=50))
    answer = tok.encode("café 日本語 🚀 done", add_special_tokens=False)
    answer.append(tok.eos_token_ids[0])
    texts, finals = {0: "", 1: ""}, {}
    for token_id in answer:
        plan = s.schedule()
        for out in s.update_from_output(plan, {r: token_id for r in plan.scheduled_req_ids}):
            assert "\ufffd" not in out.new_text
            texts[out.req_id] += out.new_text
            if out.finish_reason:
                finals[out.req_id] = (out.finish_reason, out.matched_stop)
    assert texts == {0: "café 日本", 1: "café 日本語 🚀 done"}
    assert finals == {0: (FinishReason.STOP, "語 🚀"), 1: (FinishReason.EOS, "")}


def _stream(tok, answers: dict[int, list[int]], max_tokens: int, eos: bool = False) -> dict[int, str]:
    """Runs each request through the scheduler with the given outputs; its streamed text."""
    s = Scheduler(make_config(eos_token_ids=tok.eos_token_ids, max_model_len=512, max_num_seqs=64,
                              max_num_batched_tokens=512), tok)
    for req_id in answers:
        s.add_request(req(req_id, tok.encode("Q:"), max_tokens=max_tokens))
    texts = dict.fromkeys(answers, "")
    for i in range(max_tokens):
        plan = s.schedule()
        sampled = {r: answers[r][i] for r in plan.scheduled_req_ids if i < len(answers[r])}
        for out in s.update_from_output(plan, sampled):
            texts[out.req_id] += out.new_text
    assert not s.requests
    return texts


def test_text_still_held_at_the_end_is_flushed(tok):
    """The concatenated streamed text equals decode() of the output: characters the
    detokenizer was still holding when max_tokens or EOS came are not lost."""
    import random

    rng = random.Random(7)
    complete = ["Grüße 😀🎉 東", "日本語 🚀", " café naïve", "a😀", "東"]
    answers = {i: tok.encode(t, add_special_tokens=False) for i, t in enumerate(complete)}
    # cut inside multi-byte characters, and random ids (incomplete UTF-8 at the end)
    answers.update({10 + i: tok.encode(t, add_special_tokens=False)[:-1] for i, t in enumerate(complete)})
    answers.update({20 + i: [rng.randrange(3, 400) for _ in range(rng.randrange(1, 9))] for i in range(40)})
    by_length = {k: v for k, v in answers.items() if v}
    texts = {}
    for n in sorted({len(v) for v in by_length.values()}):  # max_tokens = each answer's length
        group = {k: v for k, v in by_length.items() if len(v) == n}
        texts.update(_stream(tok, group, max_tokens=n))
    for req_id, ids in by_length.items():
        assert texts[req_id] == tok.decode(ids), (req_id, ids)
    # ended by EOS: the text before it is whole too
    ids = tok.encode("東", add_special_tokens=False)[:-1]
    eos = _stream(tok, {0: ids + [tok.eos_token_ids[0]]}, max_tokens=len(ids) + 5)
    assert eos[0] == tok.decode(ids) and eos[0].endswith("\ufffd")


def test_tokenizer_does_not_import_transformers():
    import subprocess
    import sys

    code = "import scheduler_svc.core.tokenizer, scheduler_svc.core.detokenizer, sys; " \
           "assert 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- the built-in model's tokenizer (SmolLM2-135M-Instruct, converted from its GGUF file) ---------

REAL_TEXTS = TEXTS + ["<|im_start|>user\nhi<|im_end|>\n", "def add(a, b):\n    return a + b\n",
                      "Grüße 😀🎉 東京, Österreich, ½ ≠ ∞"]


@pytest.fixture(scope="module")
def smol(smollm2_folder):
    return Tokenizer(smollm2_folder)


@pytest.fixture(scope="module")
def smol_hf(smollm2_folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_folder))


def test_builtin_model_encodes_and_renders_chats_like_transformers(smol, smol_hf):
    for text in REAL_TEXTS:
        for add_special_tokens in (True, False):
            ids = smol.encode(text, add_special_tokens=add_special_tokens)
            assert ids == smol_hf(text, add_special_tokens=add_special_tokens)["input_ids"], text
        assert smol.decode(ids) == smol_hf.decode(ids, skip_special_tokens=True)
    for chat in CHATS:  # the first has no system message: the template writes SmolLM's own
        for add_generation_prompt in (True, False):
            text = smol.render_chat(chat, add_generation_prompt=add_generation_prompt)
            assert text == smol_hf.apply_chat_template(chat, add_generation_prompt=add_generation_prompt,
                                                       tokenize=False)
            expected = smol_hf.apply_chat_template(chat, add_generation_prompt=add_generation_prompt)
            assert smol.apply_chat_template(chat, add_generation_prompt=add_generation_prompt) == \
                list(getattr(expected, "input_ids", None) or expected["input_ids"])
    assert "You are a helpful AI assistant named SmolLM" in smol.render_chat(CHATS[0])
    assert (smol.vocab_size, smol.eos_token_ids, smol.bos_token_id) == (49152, (2,), 1)


def test_builtin_model_streams_text_that_adds_up_to_decode(smol):
    prompt = smol.apply_chat_template(CHATS[1])
    for text in REAL_TEXTS:
        ids = smol.encode(text, add_special_tokens=False)
        for output in (ids, ids[:-1]):  # whole, and cut (inside a character for some)
            detok = IncrementalDetokenizer(smol, prompt)
            pieces = [detok.step(i) for i in output]
            assert "".join(pieces) + detok.flush() == smol.decode(output), (text, output)
            assert not any("\ufffd" in p for p in pieces)  # broken characters wait for flush()
    emoji = smol.encode("😀🎉", add_special_tokens=False)
    assert len(emoji) > 2 and smol.decode(emoji[:1]).endswith("\ufffd")  # byte tokens: really split
