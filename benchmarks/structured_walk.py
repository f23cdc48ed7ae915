"""Random walks through a matcher (llmserve/structured): what a model sampling under the mask
could write, for the tests (every walk's text must validate) and the mask timings. The first
`explore` tokens are drawn uniformly from the allowed ones (EOS, when allowed, a quarter of the
time); then the walk heads for the end: EOS when allowed, else a token closing a string, else
one closing arrays or objects (at most 8 in a row: a string may allow them), else a
one-character token, else any allowed token."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmserve.structured.matcher import Matcher, allowed_ids, new_bitmask

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "structured"


def corpus(name: str) -> list[dict]:
    """tests/data/structured/<name>.json: schemas, regexes, choices, grammars, refused."""
    return json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))


@dataclass
class Vocab:
    """What a walk needs of a tokenizer: its size, EOS ids, decode, and token classes."""

    size: int
    eos_ids: tuple[int, ...]
    decode: object  # list[int] -> str, as the server detokenizes
    quote: np.ndarray  # token's text starts with '"' and is only '"', ']' and '}'
    closer: np.ndarray  # token's text is only ']' and '}'
    single: np.ndarray  # token's text is one character

    @classmethod
    def of(cls, tokenizer, size: int) -> Vocab:
        texts = [tokenizer.decode([i], skip_special_tokens=False) for i in range(size)]
        quote = np.array([t[:1] == '"' and set(t) <= set('"]}') for t in texts])
        closer = np.array([bool(t) and set(t) <= set("]}") for t in texts])
        single = np.array([len(t) == 1 for t in texts])
        return cls(size, tuple(tokenizer.eos_token_ids), tokenizer.decode, quote, closer, single)


def walk(matcher: Matcher, vocab: Vocab, rng: np.random.Generator, explore: int = 24,
         max_steps: int = 600) -> list[int]:
    """The token ids of one walk to EOS (EOS not included)."""
    mask = new_bitmask(1, vocab.size)
    eos = np.array(vocab.eos_ids)
    out: list[int] = []
    closers = 0  # in a row
    for step in range(max_steps):
        matcher.fill_bitmask(mask)
        ids = allowed_ids(mask[0], vocab.size)
        assert ids.size, f"the mask allows nothing after {vocab.decode(out)!r}"
        ends = ids[np.isin(ids, eos)]
        if ends.size and (step >= explore or rng.random() < 0.25 or ends.size == ids.size):
            assert matcher.consume([int(ends[0])]) and matcher.is_stopped()
            return out
        ids = ids[~np.isin(ids, eos)]
        if step >= explore:
            classes = (vocab.quote, vocab.closer, vocab.single) if closers < 8 else (vocab.quote, vocab.single)
            for cls in classes:
                if cls[ids].any():
                    ids = ids[cls[ids]]
                    break
        token = int(rng.choice(ids))
        closers = closers + 1 if vocab.closer[token] else 0
        assert matcher.consume([token]), matcher.error
        out.append(token)
    raise AssertionError(f"no end after {max_steps} tokens: {vocab.decode(out)[:200]!r}")


def fullmatch(pattern: str, text: str) -> bool:
    return re.fullmatch(pattern, text, flags=re.DOTALL) is not None
