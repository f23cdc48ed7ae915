"""Structured outputs (torch-free, both services): constraints, their compilation for a
tokenizer (llguidance), and per-request matchers filling token bitmasks. docs/scheduler.md,
"Structured outputs", has the design and the measured figures.

Importing the package loads neither llguidance nor numpy (the scheduler core only carries
Constraints); the compiler's and the matcher's names load their modules on first use."""

from llmserve.structured.constraint import (Constraint, ConstraintError, ConstraintLimits, choice,
                                            grammar, json_object, json_schema, regex, to_grammar)

_LAZY = {name: "llmserve.structured.compiler" for name in (
    "CompileBusy", "CompiledGrammar", "CompileLimits", "GrammarCompiler", "ll_tokenizer")}
_LAZY.update({name: "llmserve.structured.matcher" for name in (
    "BatchMasks", "Matcher", "allowed", "allowed_ids", "apply_bitmask", "bitmask_words", "new_bitmask")})

__all__ = ["Constraint", "ConstraintError", "ConstraintLimits", "choice", "grammar", "json_object",
           "json_schema", "regex", "to_grammar", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
