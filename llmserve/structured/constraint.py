"""What a request's output must match: one constraint (a JSON schema, any JSON object, a regex,
a list of choices or a Lark grammar), its shape and size checked, and its llguidance grammar.

Both doors build a Constraint from what the client sent (`json_schema`, `regex`, `choice`,
`grammar`) and the API checks it before any work (docs/api.md, "Structured outputs"). No torch,
and llguidance is imported only to make the grammar (`to_grammar`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

KINDS = ("json", "regex", "choice", "grammar")
JSON_OBJECT = '{"type":"object"}'  # OpenAI's response_format json_object: any JSON object
WHITESPACE = ("flexible", "compact")
# "flexible": at each place JSON allows whitespace, one space or one newline and an indent of at
# most 20 spaces or tabs (llama.cpp's JSON rule): compact, spaced and pretty-printed JSON, but no
# blank lines or runs of spaces, which a model at temperature 1 repeats until max_tokens (with 64
# characters of any whitespace a place, 3 in 10 of SmolLM2's arrays of 3 booleans ran past 200
# tokens of newlines); "compact": none.
FLEXIBLE_WHITESPACE = r"(\x20|\x0A[\x20\x09]{0,20})"


class ConstraintError(ValueError):
    """A constraint refused: `param` names the request field (as the client spelled it)."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param
        self.message = message


@dataclass(frozen=True)
class ConstraintLimits:
    """Size bounds, checked before anything is compiled (fixed; docs/hardening.md)."""

    max_bytes: int = 64 << 10  # UTF-8 bytes of the schema, regex, grammar or all choices
    max_choices: int = 1024


LIMITS = ConstraintLimits()


@dataclass(frozen=True)
class Constraint:
    """Exactly one kind: `json` (value: a JSON schema as compact JSON text), `regex`, `grammar`
    (Lark, llguidance's dialect; GBNF is converted) or `choice` (choices). Hashable: the
    compile cache's key. `param` is where the client sent it and takes no part in equality."""

    kind: str
    value: str = ""
    choices: tuple[str, ...] = ()
    whitespace: str = "flexible"  # JSON only (WHITESPACE)
    whitespace_pattern: str | None = None  # JSON only: a regex for whitespace, over `whitespace`
    lenient: bool = False  # JSON only: keywords llguidance does not implement are ignored
    param: str = field(default="", compare=False)

    @property
    def num_bytes(self) -> int:
        return sum(len(s.encode("utf-8", "surrogatepass")) for s in (self.value, *self.choices))

    def at(self, param: str) -> Constraint:
        """The same constraint, sent as `param`."""
        return replace(self, param=param)


def json_schema(schema: str | Mapping | bool, param: str, *, whitespace: str = "flexible",
                whitespace_pattern: str | None = None, lenient: bool = False,
                limits: ConstraintLimits = LIMITS) -> Constraint:
    """A JSON-schema constraint from a schema as JSON text or as parsed JSON."""
    if isinstance(schema, str):
        _check_size(param, len(schema.encode("utf-8", "surrogatepass")), limits)
        try:
            schema = json.loads(schema)
        except RecursionError:
            raise ConstraintError(param, f"{param}: the schema is nested too deeply") from None
        except ValueError as e:
            raise ConstraintError(param, f"{param}: the schema is not valid JSON: {e}") from None
    if schema is True:
        schema = {}
    if not isinstance(schema, Mapping):
        raise ConstraintError(param, f"{param}: a JSON schema must be a JSON object, got "
                              f"{type(schema).__name__}")
    try:
        text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except RecursionError:
        raise ConstraintError(param, f"{param}: the schema is nested too deeply") from None
    except ValueError as e:  # NaN or infinity in the schema
        raise ConstraintError(param, f"{param}: the schema is not valid JSON: {e}") from None
    if whitespace not in WHITESPACE:
        raise ConstraintError(param, f"{param}: whitespace must be one of {', '.join(WHITESPACE)}")
    constraint = Constraint("json", text, whitespace=whitespace,
                            whitespace_pattern=whitespace_pattern, lenient=lenient, param=param)
    _check_size(param, constraint.num_bytes + len(whitespace_pattern or ""), limits)
    return constraint


def json_object(param: str, *, whitespace: str = "flexible",
                whitespace_pattern: str | None = None) -> Constraint:
    return json_schema(JSON_OBJECT, param, whitespace=whitespace, whitespace_pattern=whitespace_pattern)


def regex(pattern: str, param: str, limits: ConstraintLimits = LIMITS) -> Constraint:
    """The whole output matches `pattern` (Rust regex syntax; no lookarounds or backreferences)."""
    return _text("regex", pattern, param, limits)


def grammar(text: str, param: str, limits: ConstraintLimits = LIMITS) -> Constraint:
    """A context-free grammar in Lark syntax (llguidance's dialect: docs/api.md); a GBNF grammar
    (llama.cpp's, rules written `::=`) is converted to it."""
    return _text("grammar", text, param, limits)


def choice(choices: Sequence[str], param: str, limits: ConstraintLimits = LIMITS) -> Constraint:
    """The output is exactly one of `choices` (vLLM's guided choice)."""
    if len(choices) > limits.max_choices:  # before looking at any of them
        raise ConstraintError(param, f"{param} has {len(choices)} choices; the limit is "
                              f"{limits.max_choices}")
    if not choices:
        raise ConstraintError(param, f"{param} must list at least one choice")
    if not all(isinstance(c, str) for c in choices):
        raise ConstraintError(param, f"{param}: every choice must be a string")
    constraint = Constraint("choice", choices=tuple(choices), param=param)
    _check_size(param, constraint.num_bytes, limits)
    return constraint


def _text(kind: str, text: str, param: str, limits: ConstraintLimits) -> Constraint:
    if not isinstance(text, str):
        raise ConstraintError(param, f"{param} must be a string")
    if text == "":
        raise ConstraintError(param, f"{param} is empty")
    constraint = Constraint(kind, text, param=param)
    _check_size(param, constraint.num_bytes, limits)
    return constraint


def _check_size(param: str, num_bytes: int, limits: ConstraintLimits) -> None:
    if num_bytes > limits.max_bytes:
        raise ConstraintError(param, f"{param} has {num_bytes} bytes; the limit is {limits.max_bytes}")


def json_options(c: Constraint) -> dict:
    """llguidance's JSON compile options (applied over the schema's own "x-guidance")."""
    options: dict = {"lenient": c.lenient}
    if c.whitespace_pattern is not None:
        options["whitespace_pattern"] = c.whitespace_pattern
    elif c.whitespace == "compact":
        options["whitespace_flexible"] = False
    else:
        options["whitespace_pattern"] = FLEXIBLE_WHITESPACE
    return options


def to_grammar(c: Constraint) -> str:
    """llguidance's grammar text (a TopLevelGrammar as JSON) for the constraint: what a matcher
    is built from, and what the executor is sent. Cheap (no tokenizer); checks nothing but a
    GBNF grammar's syntax (ConstraintError); the compiler finds every other fault."""
    from llguidance import LLMatcher, grammar_from

    if c.kind == "json":
        return LLMatcher.grammar_from_json_schema(c.value, overrides=json_options(c))
    if c.kind == "regex":
        return LLMatcher.grammar_from_regex(c.value)
    if c.kind == "choice":
        return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(x) for x in c.choices))
    if c.kind == "grammar":
        try:
            return grammar_from("grammar", c.value)
        except (ValueError, RecursionError) as e:
            raise ConstraintError(c.param, f"{c.param} is not a grammar this server can parse "
                                  f"(Lark or GBNF): {e}") from None
    raise ConstraintError(c.param, f"{c.param}: unknown constraint kind {c.kind!r}")
