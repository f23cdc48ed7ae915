"""Every output validates: random walks through the matcher of every grammar in the corpus
(tests/data/structured: JSON schemas, regexes, choices, Lark and GBNF grammars) end in text that
`jsonschema` validates, that the regex matches whole, or that is one of the choices, on the
tiny test tokenizer and on the built-in model's 49k vocabulary. This is the torch-free core of
"every output of the built-in model validates": whatever the model samples under the mask is
one of these walks."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from benchmarks.structured_walk import Vocab, corpus, fullmatch, walk
from llmserve.structured import constraint as sc

FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER
SCHEMAS = corpus("schemas")


def constraints() -> list[tuple[str, sc.Constraint, object]]:
    """(name, constraint, check(text) -> error or None) for the whole corpus."""
    def schema_check(entry):
        def check(text):
            checker = FORMATS if entry.get("format_checked", True) else None
            try:
                jsonschema.validate(json.loads(text), entry["schema"], format_checker=checker)
            except (ValueError, jsonschema.ValidationError) as e:
                return str(e).splitlines()[0]
            return None
        return check

    out = [(f"json:{e['name']}", sc.json_schema(e["schema"], "json"), schema_check(e)) for e in SCHEMAS]
    out += [(f"regex:{e['name']}", sc.regex(e["regex"], "regex"),
             lambda t, r=e["regex"]: None if fullmatch(r, t) else "no match") for e in corpus("regexes")]
    out += [(f"choice:{e['name']}", sc.choice(e["choices"], "choice"),
             lambda t, c=e["choices"]: None if t in c else "not a choice") for e in corpus("choices")]
    out += [(f"grammar:{e['name']}", sc.grammar(e["grammar"], "grammar"),
             lambda t, r=e["regex"]: None if fullmatch(r, t) else "no match") for e in corpus("grammars")]
    return out


def test_the_corpus_is_the_size_the_issue_asks_for():
    names = [name for name, _, _ in constraints()]
    assert sum(n.startswith("json:") for n in names) >= 50
    assert sum(n.startswith("regex:") for n in names) >= 10
    assert len(set(names)) == len(names)
    text = json.dumps([e["schema"] for e in SCHEMAS])
    for keyword in ("anyOf", "minItems", "maxItems", "enum", "pattern", "required", "minimum",
                    "maximum", "$ref", "format", "additionalProperties", "prefixItems", "oneOf"):
        assert keyword in text, keyword


def _walk_all(compiler, tokenizer, vocab: Vocab, walks: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    failures = []
    for name, constraint, check in constraints():
        grammar = compiler.compile(constraint)
        for _ in range(walks):
            text = tokenizer.decode(walk(grammar.matcher(), vocab, rng))
            error = check(text)
            if error is not None:
                failures.append(f"{name}: {text!r}: {error}")
    return failures


def test_every_walk_validates_on_the_tiny_tokenizer(tiny, tiny_compiler, tiny_vocab):
    assert _walk_all(tiny_compiler, tiny, tiny_vocab, walks=6, seed=1) == []


@pytest.mark.timeout(120)
def test_every_walk_validates_on_the_builtin_vocabulary(smol, smol_compiler):
    assert _walk_all(smol_compiler, smol, Vocab.of(smol, smol.vocab_size), walks=2, seed=2) == []


def test_date_time_departure_is_only_the_leap_second(tiny, tiny_compiler, tiny_vocab):
    """The one documented departure (docs/api.md): llguidance's date-time allows second 60
    (RFC 3339's leap second), which jsonschema's checker refuses; all else validates."""
    entry = next(e for e in SCHEMAS if e["name"] == "format_datetime")
    assert entry["format_checked"] is False
    rng = np.random.default_rng(3)
    grammar = tiny_compiler.compile(sc.json_schema(entry["schema"], "json"))
    for _ in range(20):
        value = json.loads(tiny.decode(walk(grammar.matcher(), tiny_vocab, rng)))
        try:
            jsonschema.validate(value, entry["schema"], format_checker=FORMATS)
        except jsonschema.ValidationError:
            assert value[17:19] == "60", value
