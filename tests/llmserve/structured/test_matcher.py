"""The matcher the executor's host thread advances: its masks (llguidance's packed int32 layout)
agree token for token with the grammar, a batch filled at once equals the rows filled one by
one, rollback and reset restore earlier masks, a refused token leaves only EOS, and the numpy
reference of the device's masking sets exactly the disallowed logits to -inf."""

from __future__ import annotations

import numpy as np
import pytest

from llmserve.structured import constraint as sc
from llmserve.structured.matcher import (BatchMasks, allowed, allowed_ids, apply_bitmask,
                                         bitmask_words, new_bitmask)

from .conftest import TINY_VOCAB

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer"}}, "required": ["name", "age"]}


def _mask(m) -> np.ndarray:
    mask = new_bitmask(1, TINY_VOCAB)
    m.fill_bitmask(mask)
    return mask[0]


def test_the_mask_agrees_with_the_grammar_token_by_token(tiny, tiny_compiler):
    m = tiny_compiler.compile(sc.json_schema(PERSON, "json")).matcher()
    m.consume(tiny.encode('{"name": "Al', add_special_tokens=False))
    row = _mask(m)
    assert row.shape == (bitmask_words(TINY_VOCAB),) and row.dtype == np.int32
    ids = set(allowed_ids(row, TINY_VOCAB).tolist())
    for t in range(TINY_VOCAB):
        assert allowed(row, t) == (t in ids) == (m.validate([t]) == 1), t
    assert m.allowed(next(iter(ids))) and not m.allowed(tiny.eos_token_ids[0])


def test_accepting_allows_eos_and_stopped_allows_only_eos(tiny, tiny_compiler):
    eos = tiny.eos_token_ids[0]
    m = tiny_compiler.compile(sc.regex("[0-9]{1,3}", "regex")).matcher()
    assert not m.is_accepting() and not allowed(_mask(m), eos)
    assert m.consume(tiny.encode("12", add_special_tokens=False))
    assert m.is_accepting() and not m.is_stopped() and allowed(_mask(m), eos)
    choice = tiny_compiler.compile(sc.choice(["yes"], "choice")).matcher()
    assert choice.consume(tiny.encode("yes", add_special_tokens=False))
    assert choice.is_stopped() and allowed_ids(_mask(choice), TINY_VOCAB).tolist() == [eos]
    assert choice.consume([eos]) and choice.error == ""


def test_a_refused_token_is_an_error_and_only_eos_remains(tiny, tiny_compiler):
    m = tiny_compiler.compile(sc.regex("[0-9]+", "regex")).matcher()
    assert not m.consume(tiny.encode("x", add_special_tokens=False))
    assert m.error and m.is_stopped()
    assert allowed_ids(_mask(m), TINY_VOCAB).tolist() == list(tiny.eos_token_ids)


def test_rollback_and_reset_restore_earlier_masks(tiny, tiny_compiler):
    """Speculative decoding: drafts are checked (validate), consumed, and rolled back when
    rejected."""
    m = tiny_compiler.compile(sc.json_schema(PERSON, "json")).matcher()
    start = _mask(m).copy()
    ids = tiny.encode('{"name": "Bo", "age": 41}', add_special_tokens=False)
    m.consume(ids[:4])
    at4 = _mask(m).copy()
    assert m.validate(ids[4:]) == len(ids) - 4 and m.validate([tiny.eos_token_ids[0]]) == 0
    m.consume(ids[4:7])
    m.rollback(3)
    assert np.array_equal(_mask(m), at4)
    m.consume(ids[4:])
    assert m.is_accepting()
    m.reset()
    assert np.array_equal(_mask(m), start)


def test_a_batch_fills_like_rows_one_by_one(tiny, tiny_compiler):
    grammars = [tiny_compiler.compile(c) for c in (
        sc.json_schema(PERSON, "json"), sc.regex("[a-z]+@[a-z]+", "regex"), sc.choice(["red", "green"], "choice"))]
    matchers = []
    for i in range(9):
        m = grammars[i % 3].matcher()
        m.consume(tiny.encode(['{"na', "ab", "gr"][i % 3][: i % 4], add_special_tokens=False))
        matchers.append(m)
    rows = [(m, 2 * i) for i, m in enumerate(matchers)]  # odd rows have no grammar
    together = new_bitmask(2 * len(matchers), TINY_VOCAB)
    BatchMasks(2).fill(rows, together)
    for m, row in rows:
        assert np.array_equal(together[row], _mask(m))
        assert (together[row + 1] == -1).all()


def test_wrong_mask_shapes_are_refused(tiny_compiler):
    m = tiny_compiler.compile(sc.regex("a", "regex")).matcher()
    with pytest.raises(ValueError, match="int32 rows of 16 words"):
        m.fill_bitmask(np.zeros((1, 15), dtype=np.int32))
    with pytest.raises(ValueError):
        m.fill_bitmask(np.zeros((1, 16), dtype=np.int64))
    with pytest.raises(ValueError):
        BatchMasks(1).fill([(m, 0)], np.zeros((2, 32), dtype=np.int32)[:, ::2])
    with pytest.raises(ValueError, match="rows must be in"):
        BatchMasks(1).fill([(m, 2)], new_bitmask(2, TINY_VOCAB))


def test_the_reference_masking_of_logits():
    rng = np.random.default_rng(0)
    vocab = 70  # not a multiple of 32: the last word is partial; logits may be wider
    mask = rng.integers(-(2**31), 2**31, size=(3, bitmask_words(vocab)), dtype=np.int64).astype(np.int32)
    logits = rng.standard_normal((3, vocab + 6)).astype(np.float32)
    before = logits.copy()
    apply_bitmask(logits, mask)
    for r in range(3):
        for t in range(vocab + 6):
            keep = t < 32 * mask.shape[1] and allowed(mask[r], t)
            assert logits[r, t] == (before[r, t] if keep else -np.inf), (r, t)
