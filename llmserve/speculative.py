"""`--speculative-config` (vLLM's JSON), read the same way by the launcher and both services.

One parser: the launcher asks whether a config names a draft model (then the executor gets it
too, and loads the draft), the executor takes the draft's folder and k from it, the scheduler
the whole of it (docs/scheduler.md, "Speculative decoding"). No torch here.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, fields

METHODS = ("ngram", "draft_model")


@dataclass(frozen=True)
class SpecDecodeConfig:
    """vLLM's --speculative-config fields this server implements (methods ngram, draft_model)."""

    method: str = "ngram"
    num_speculative_tokens: int = 0  # most drafts a request verifies per step
    prompt_lookup_max: int = 0  # longest n-gram matched (tried first); ngram only
    prompt_lookup_min: int = 0  # shortest n-gram matched; ngram only
    model: str = ""  # draft_model: the draft's folder or GGUF (loaded by the executor)
    disable_by_batch_size: int = 0  # nobody speculates with more running requests (0 = never)


def method_of(raw: dict) -> str:
    """vLLM's rule: the method given, else draft_model when "model" is given, else ngram."""
    return raw.get("method", "draft_model" if "model" in raw else "ngram")


def names_draft_model(text: str) -> bool:
    """Whether a --speculative-config asks for a draft model (method draft_model, or a "model"
    without a method, as vLLM infers): then the executor needs it too (it loads the draft).
    Anything unreadable goes to the scheduler alone, which refuses it with the reason."""
    try:
        raw = json.loads(text)
    except ValueError:
        return False
    return isinstance(raw, dict) and method_of(raw) == "draft_model"


def parse_speculative_config(text: str) -> SpecDecodeConfig | None:
    """The --speculative-config JSON (vLLM's meaning); "" = off. ValueError for anything
    else than a valid n-gram or draft-model config. As in vLLM, the method is draft_model
    when "model" is given without one (else ngram), and for ngram a missing lookup bound takes
    the other's value, both missing 5."""
    if not text.strip():
        return None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError("must be a JSON object")
    known = {f.name for f in fields(SpecDecodeConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"unsupported fields {unknown} (supported: {sorted(known)})")
    method = method_of(raw)
    method = "ngram" if method == "[ngram]" else method
    if method not in METHODS:
        raise ValueError(f"method {method!r}: only 'ngram' (prompt lookup) and 'draft_model' are implemented")
    values = {}
    for name in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "disable_by_batch_size"):
        value = raw.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        values[name] = value
    k, lo, hi = values["num_speculative_tokens"], values["prompt_lookup_min"], values["prompt_lookup_max"]
    if k is None:
        raise ValueError("num_speculative_tokens is required")
    if method == "draft_model":
        model = raw.get("model")
        if not isinstance(model, str) or not model.strip():
            raise ValueError(f"method draft_model needs \"model\": the draft's folder or GGUF file, got {model!r}")
        if lo is not None or hi is not None:
            raise ValueError("prompt_lookup_min / prompt_lookup_max apply to method ngram only")
        return SpecDecodeConfig("draft_model", k, model=model,
                                disable_by_batch_size=values["disable_by_batch_size"] or 0)
    if "model" in raw:
        raise ValueError("\"model\" applies to method draft_model only")
    lo, hi = (lo or hi or 5), (hi or lo or 5)
    if lo > hi:
        raise ValueError(f"prompt_lookup_min {lo} > prompt_lookup_max {hi}")
    return SpecDecodeConfig("ngram", k, hi, lo, disable_by_batch_size=values["disable_by_batch_size"] or 0)


def draft_model_of(text: str) -> tuple[str, int]:
    """(draft model, k) of a --speculative-config: the executor's part of it, ("", 0) when it
    is off or names no draft model (n-gram drafts come from the scheduler). ValueError as
    parse_speculative_config: both services accept and refuse the same configs."""
    config = parse_speculative_config(str(text))
    if config is None or config.method != "draft_model":
        return "", 0
    return config.model, config.num_speculative_tokens


def scheduler_flag(text: str) -> str:
    """argparse type of the scheduler's --speculative-config: the text, once it parses."""
    _as_flag(parse_speculative_config, text)
    return text


def executor_flag(text: str) -> tuple[str, int]:
    """argparse type of the executor's --speculative-config: draft_model_of(text)."""
    return _as_flag(draft_model_of, text)


def _as_flag(read, text: str):
    try:
        return read(text)
    except ValueError as e:  # argparse shows an ArgumentTypeError's reason as the flag's error
        raise argparse.ArgumentTypeError(str(e)) from None
