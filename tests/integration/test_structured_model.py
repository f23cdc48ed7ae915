"""Structured outputs on the built-in model (issue 25, "Correct"): both real services on
SmolLM2-135M-Instruct on CPU, driven through the OpenAI HTTP door with the `openai` package.

- The corpus (tests/data/structured: JSON schemas as `response_format` json_schema, regexes as
  `structured_outputs.regex`), 5 samples each in CI, 10 in the full run (n, seed 1) at
  temperature 1: exactly n an entry come back, every finished output validates (`jsonschema` with its format checker, or the
  regex matches whole). Every output of a *bounded* entry finishes ("stop": the grammar ended
  it). An *open* entry (`_open`: its text has no length bound — a number's digits, an integer
  or string without bounds, an array or object without a largest size, a `$ref`) may legitimately
  run to max_tokens: SmolLM2 at temperature 1 writes digits or recursion on and on (measured:
  {"type": "number"} ended 5 of 10 within 200 tokens, the linked list 3 of 10); such a cut output
  must still be a prefix the grammar accepts, token for token (checked here by a matcher of our
  own), and at least 90% of all outputs finish.
- Greedy with a grammar equals greedy without it, token for token, wherever the unconstrained
  output already satisfies the grammar (at least 8 cases must qualify); a grammar the output
  violates turns it into a valid one.

The CI run takes every fourth schema and every third regex (21 entries, 5 samples each);
LLMSERVE_STRUCTURED_FULL=1 runs all 78 with 10 samples (docs/api.md, "Structured outputs", gives both timings on the 2-core machine).
"""

from __future__ import annotations

import asyncio
import json
import os
import re

import jsonschema
import pytest

openai = pytest.importorskip("openai")

from benchmarks.structured_walk import corpus, fullmatch  # noqa: E402
from llmserve.structured import constraint as sc  # noqa: E402

FULL = os.environ.get("LLMSERVE_STRUCTURED_FULL") == "1"
SEED, CONCURRENCY = 1, 12
SAMPLES = 10 if FULL else 5  # (5: the CI suite's time; the full run's figures are in docs/api.md)
# max_tokens: a bounded entry's longest output here is ~120 tokens; an open one is cut sooner
# (its runs of digits cost most of the time otherwise)
MAX_TOKENS, OPEN_MAX_TOKENS = 200, 96
FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER
# Two earlier turns show the model what a reply is: the value alone, then the end of the turn.
JSON_SHOTS = [
    {"role": "user", "content": 'Reply with JSON matching this schema: {"type": "integer"}'},
    {"role": "assistant", "content": "7"},
    {"role": "user", "content": 'Reply with JSON matching this schema: {"type": "object", "properties": '
                                '{"ok": {"type": "boolean"}, "name": {"type": "string"}}}'},
    {"role": "assistant", "content": '{"ok": true, "name": "Ada"}'}]
REGEX_SHOTS = [{"role": "user", "content": "Reply with text matching this regex: [0-9]{2}"},
               {"role": "assistant", "content": "42"}]


def _open(s) -> bool:
    """The schema's JSON text has no length bound (see the module's docstring)."""
    if not isinstance(s, dict):
        return s is True
    if "enum" in s or "const" in s:
        return False
    types = s.get("type", [])
    types = [types] if isinstance(types, str) else types
    has = lambda *keys: any(k in s for k in keys)  # noqa: E731
    if "$ref" in s or "number" in types or s == {}:
        return True
    if "integer" in types and not (has("minimum", "exclusiveMinimum") and has("maximum", "exclusiveMaximum")):
        return True
    if "string" in types and not has("maxLength", "pattern", "format"):
        return True
    if "object" in types and s.get("additionalProperties", True) is not False and "maxProperties" not in s:
        return True
    if ("array" in types and "maxItems" not in s and s.get("items", True) is not False) or (
            "patternProperties" in s and "maxProperties" not in s):
        return True
    subs = [*s.get("properties", {}).values(), *s.get("prefixItems", []), *s.get("anyOf", []),
            *s.get("oneOf", []), *s.get("allOf", [])]
    subs += [s[k] for k in ("items", "additionalProperties") if isinstance(s.get(k), dict)]
    return any(_open(x) for x in subs)


def _entries() -> list[dict]:
    """name, messages, the request's extra fields, its Constraint, check(text) -> error or None,
    and whether it is open."""
    schemas, regexes = corpus("schemas"), corpus("regexes")
    if not FULL:
        schemas, regexes = schemas[::4], regexes[::3]
    out = []
    for e in schemas:
        def check(text, e=e):
            try:
                jsonschema.validate(json.loads(text), e["schema"],
                                    format_checker=FORMATS if e.get("format_checked", True) else None)
            except (ValueError, jsonschema.ValidationError) as err:
                return str(err).splitlines()[0]
            return None
        out.append({"name": f"json:{e['name']}", "check": check, "open": _open(e["schema"]),
                    "constraint": sc.json_schema(e["schema"], "json"),
                    "messages": JSON_SHOTS + [{"role": "user", "content": "Reply with JSON matching this schema: "
                                               + json.dumps(e["schema"])}],
                    "extra": {"response_format": {"type": "json_schema", "json_schema": {
                        "name": e["name"], "schema": e["schema"], "strict": True}}}})
    for e in regexes:
        out.append({"name": f"regex:{e['name']}", "open": bool(re.search(r"[+*]", e["regex"])),
                    "check": lambda t, r=e["regex"]: None if fullmatch(r, t) else "no match",
                    "constraint": sc.regex(e["regex"], "regex"),
                    "messages": REGEX_SHOTS + [{"role": "user", "content": "Reply with text matching this regex: "
                                                + e["regex"]}],
                    "extra": {"extra_body": {"structured_outputs": {"regex": e["regex"]}}}})
    return out


@pytest.fixture(scope="module")
def cluster(smollm2_cluster):
    return smollm2_cluster  # tests/integration/conftest.py: the package's built-in-model cluster


@pytest.fixture(scope="module")
def compiler(smollm2_folder):
    """Our own compiler for the model's tokenizer: checks a cut output token for token."""
    from llmserve.structured.compiler import GrammarCompiler, ll_tokenizer

    tok = ll_tokenizer((smollm2_folder / "tokenizer.json").read_text(), 49152, (2,))
    c = GrammarCompiler(tok)
    yield c
    c.close()


def _chat_all(cluster, requests: list[dict]) -> list:
    """Sends every request at once (CONCURRENCY in flight) -> their responses, in order."""
    async def run():
        async with openai.AsyncOpenAI(base_url=cluster.http_url + "/v1", api_key="none", max_retries=0,
                                      timeout=600) as client:
            model = (await client.models.list()).data[0].id
            gate = asyncio.Semaphore(CONCURRENCY)

            async def one(r):
                async with gate:
                    return await client.chat.completions.create(model=model, **r)
            return await asyncio.gather(*(one(r) for r in requests))
    return asyncio.run(run())


@pytest.fixture(scope="module")
def sampled(cluster):
    entries = _entries()
    responses = _chat_all(cluster, [dict(messages=e["messages"], n=SAMPLES, temperature=1.0, seed=SEED,
                                         max_tokens=OPEN_MAX_TOKENS if e["open"] else MAX_TOKENS, **_with_ids(e["extra"]))
                                    for e in entries])
    return entries, responses


def _with_ids(extra: dict) -> dict:
    extra = json.loads(json.dumps(extra))
    extra.setdefault("extra_body", {})["return_token_ids"] = True
    return extra


@pytest.mark.timeout(1500 if FULL else 600)  # the sampling runs in its fixture, inside this limit (107 s on CI)
def test_every_output_of_the_corpus_validates_at_temperature_1(sampled, compiler):
    entries, responses = sampled
    assert len(entries) == (78 if FULL else 21) and sum(e["open"] for e in entries) < len(entries) * 3 // 4
    failures, num_outputs, num_stopped = [], 0, 0
    for e, r in zip(entries, responses):
        num_outputs += len(r.choices)
        assert sorted(c.index for c in r.choices) == list(range(SAMPLES)), e["name"]
        for c in r.choices:
            text = c.message.content
            if c.finish_reason == "stop":
                num_stopped += 1
                if (error := e["check"](text)) is not None:
                    failures.append(f"{e['name']}: {text!r}: {error}")
            elif c.finish_reason != "length" or not e["open"]:
                failures.append(f"{e['name']} (bounded) ended {c.finish_reason!r}: {text[:80]!r}")
            else:  # an open entry cut at max_tokens: a prefix its grammar accepts, every token
                ids = c.model_extra["token_ids"]
                m = compiler.compile(e["constraint"]).matcher()
                if len(ids) != OPEN_MAX_TOKENS or not m.consume(ids):
                    failures.append(f"{e['name']}: a cut output the grammar refuses: {text[:80]!r}")
    assert failures == []
    assert num_outputs == SAMPLES * len(entries) and num_stopped >= 0.9 * num_outputs, (num_stopped, num_outputs)


def _person(**props):
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


YES_NO = {"choice": ["Yes.", "No."]}
# (prompt, structured_outputs): each grammar was chosen for what the question asks, before
# looking at the answer; the greedy answers that satisfy it (most) must not change at all.
GREEDY = [
    ("Say only the word yes.", YES_NO),
    ("Is the sky blue? Answer yes or no.", YES_NO),
    ("What is the capital of France? Answer in one word.", {"regex": r"The capital of [A-Z][a-z]+ is [A-Z][a-z]+\."}),
    ("What is 2 + 2? Reply with a number only.", {"regex": r"[0-9]+( \+ [0-9]+ = [0-9]+)?"}),
    ('Reply with a JSON object with a key "name" set to "Alice".', {"json": _person(name={"type": "string"})}),
    ("Write the year World War II ended.", {"regex": r"[A-Za-z ]+ (19|20)[0-9]{2}\."}),
    ("What is the opposite of hot? One word.", {"regex": r"([A-Z][a-z]*)( [a-z]+)*\."}),
    ("Is water wet? Reply true or false.", {"regex": r"(True|False)(\. [A-Za-z ]+\.)?"}),
    ("How many legs does a spider have? Answer with a number.", {"regex": r"[A-Za-z ]+ [0-9]+\. [A-Za-z ]+ [0-9]+ [a-z]+\."}),
    ("What is the capital of Italy?", {"grammar": 'start: PLACE ", " PLACE "."\nPLACE: /[A-Z][A-Za-z ]+/'}),
    ("Name a color. One word.", {"grammar": 'start: /[A-Z][a-z ]+/ ": " /"[A-Z][a-z]+"/'}),
    # the model's own answers break these: the grammar must change them into valid ones
    ('Reply with the JSON {"ok": true}.', {"json": _person(ok={"type": "boolean"})}),
    ("Give me a JSON list of three numbers.", {"json": {"type": "array", "items": {"type": "number", "maximum": 100},
                                                       "minItems": 3, "maxItems": 3}}),
    ("Translate 'cat' to French. One word.", {"choice": ["chat", "chien", "oiseau"]}),
]


def _satisfies(constraint: dict, text: str) -> bool:
    if "choice" in constraint:
        return text in constraint["choice"]
    if "regex" in constraint:
        return fullmatch(constraint["regex"], text)
    if "json" in constraint:
        try:
            jsonschema.validate(json.loads(text), constraint["json"])
        except (ValueError, jsonschema.ValidationError):
            return False
        return True
    return None  # a grammar: its regex twin decides (GRAMMAR_TEXT)


GRAMMAR_TEXT = {"What is the capital of Italy?": r"[A-Z][A-Za-z ]+, [A-Z][A-Za-z ]+\.",
                "Name a color. One word.": r'[A-Z][a-z ]+: "[A-Z][a-z]+"'}


def test_greedy_with_a_grammar_equals_greedy_without_it_where_it_fits(cluster):
    base = dict(temperature=0.0, max_tokens=48, extra_body={"return_token_ids": True})
    requests = []
    for prompt, constraint in GREEDY:
        messages = [{"role": "user", "content": prompt}]
        requests += [dict(messages=messages, **base),
                     dict(messages=messages, **{**base, "extra_body": {**base["extra_body"], "structured_outputs": constraint}})]
    responses = _chat_all(cluster, requests)
    fits, changed = [], []
    for i, (prompt, constraint) in enumerate(GREEDY):
        free, bound = responses[2 * i].choices[0], responses[2 * i + 1].choices[0]
        check = (lambda t, p=prompt: fullmatch(GRAMMAR_TEXT[p], t)) if "grammar" in constraint else (
            lambda t, c=constraint: _satisfies(c, t))
        assert bound.finish_reason == "stop" and check(bound.message.content), (prompt, bound.message.content)
        if free.finish_reason == "stop" and check(free.message.content):
            fits.append(prompt)
            assert bound.model_extra["token_ids"] == free.model_extra["token_ids"], (prompt, free.message.content,
                                                                                     bound.message.content)
        else:
            changed.append(prompt)
            assert bound.message.content != free.message.content, prompt
    assert len(fits) >= 8 and len(changed) >= 3, (fits, changed)
