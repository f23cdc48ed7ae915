"""The random models' tokenizer (random_model.build_tokenizer): exactly vocab_size ids, the
padding mostly plain vocabulary entries (llguidance builds a tokenizer of 128k added tokens in
~100 s, which a start-up's grammar warm-up paid), a few added tokens kept."""

from __future__ import annotations

import json

import pytest

from executor_svc.model_loader.random_model import ADDED_PADDING, BOS, EOS, build_tokenizer


@pytest.mark.parametrize("vocab_size", [403, 416, 500, 128256])
def test_the_padding_is_plain_vocabulary_but_for_a_few_added_tokens(tmp_path, vocab_size):
    from tokenizers import Tokenizer

    build_tokenizer(tmp_path, vocab_size, 4096)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tok.get_vocab_size() == vocab_size
    spec = json.loads((tmp_path / "tokenizer.json").read_text())
    added = [t["content"] for t in spec["added_tokens"]]
    padding = [t for t in added if t.startswith("<|x")]
    assert len(padding) == min(ADDED_PADDING, vocab_size - 400)
    assert added[:3] == [BOS, EOS, "<|end|>"] and len(added) == 3 + len(padding)
    ids = sorted(spec["model"]["vocab"].values()) + [t["id"] for t in spec["added_tokens"][3:]]
    assert ids == list(range(vocab_size))  # every id once: the specials are in the model's vocabulary too
    # every id decodes to its own text; the added padding still encodes as one token
    assert tok.decode([vocab_size - 1]) == padding[-1]
    if vocab_size > 400 + ADDED_PADDING:
        assert tok.decode([400]) == "<x0>"
    assert padding[-1] in tok.encode(f"added {padding[-1]} tokens").tokens


def test_llguidance_takes_the_padded_tokenizer(tmp_path):
    from llmserve.structured.compiler import ll_tokenizer

    build_tokenizer(tmp_path, 128256, 4096)
    tok = ll_tokenizer((tmp_path / "tokenizer.json").read_text(), 128256, (1,))
    assert tok.vocab_size == 128256
