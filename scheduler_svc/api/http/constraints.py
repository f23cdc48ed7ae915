"""Structured outputs on the HTTP door: OpenAI's `response_format` and vLLM's
`structured_outputs` (and its older `guided_*` fields), each turned into one Constraint
(llmserve/structured), checked like every other field by request_params.py and compiled at
admission (api/structured.py). At most one of them per request."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from llmserve.structured import constraint as sc
from scheduler_svc.api.structured import request_error
from scheduler_svc.api.validation import invalid


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class JsonSchemaFormat(_Strict):
    """OpenAI's response_format.json_schema. `strict: false` lets keywords this server does not
    implement be ignored; unset or true refuses them by name."""

    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | StrictBool = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Strict):
    """vLLM's structured_outputs: one of json, regex, choice, grammar, json_object."""

    json_: str | dict[str, Any] | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False  # JSON: compact, no whitespace at all
    whitespace_pattern: str | None = None  # JSON: a regex for whitespace
    disable_fallback: bool = False  # accepted: one backend, nothing to fall back to


class StructuredFields(BaseModel):
    """The body fields (a base of the generation bodies)."""

    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None

    def constraint(self) -> sc.Constraint | None:
        """The request's constraint, or None; RequestError naming the field when it is bad."""
        try:
            found = [c for c in (self._response_format(), self._structured(), self._guided()) if c]
        except sc.ConstraintError as e:
            raise request_error(e) from None
        if len(found) > 1:
            raise invalid(f"{found[1].param} and {found[0].param} both constrain the output; send "
                          "one of response_format, structured_outputs and guided_*", found[1].param)
        return found[0] if found else None

    def _response_format(self) -> sc.Constraint | None:
        f = self.response_format
        if f is None or f.type == "text":
            if f is not None and f.json_schema is not None:
                raise invalid("response_format.json_schema needs type json_schema",
                              "response_format.json_schema")
            return None
        if f.type == "json_object":
            return sc.json_object("response_format")
        if f.json_schema is None:
            raise invalid("response_format of type json_schema needs json_schema", "response_format")
        return sc.json_schema(f.json_schema.schema_, "response_format.json_schema.schema",
                              lenient=f.json_schema.strict is False)

    def _structured(self) -> sc.Constraint | None:
        s = self.structured_outputs
        if s is None:
            return None
        given = {k: v for k, v in (("json", s.json_), ("regex", s.regex), ("choice", s.choice),
                                   ("grammar", s.grammar), ("json_object", s.json_object or None))
                 if v is not None}
        if len(given) != 1:
            raise invalid(f"structured_outputs needs exactly one of json, regex, choice, grammar and "
                          f"json_object; got {sorted(given) or 'none'}", "structured_outputs")
        (key, value), = given.items()
        param = f"structured_outputs.{key}"
        whitespace = {"whitespace": "compact" if s.disable_any_whitespace else "flexible",
                      "whitespace_pattern": s.whitespace_pattern}
        if key == "json":
            return sc.json_schema(value, param, **whitespace)
        if key == "json_object":
            return sc.json_object(param, **whitespace)
        return {"regex": sc.regex, "choice": sc.choice, "grammar": sc.grammar}[key](value, param)

    def _guided(self) -> sc.Constraint | None:
        given = [(k, getattr(self, k)) for k in ("guided_json", "guided_regex", "guided_choice",
                                                 "guided_grammar") if getattr(self, k) is not None]
        if len(given) > 1:
            raise invalid(f"{given[1][0]} and {given[0][0]} both constrain the output; send one", given[1][0])
        if not given:
            return None
        (key, value), = given
        if key == "guided_json":
            return sc.json_schema(value, key, whitespace_pattern=self.guided_whitespace_pattern)
        return {"guided_regex": sc.regex, "guided_choice": sc.choice, "guided_grammar": sc.grammar}[key](value, key)
