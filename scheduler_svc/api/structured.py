"""Structured outputs at admission, for both doors: a request's constraint (built by its door,
llmserve/structured) is compiled for the served tokenizer before the request is admitted, so a
schema this server cannot run is refused naming its field, before any work. Compilation runs in
the compiler's threads, never on the event loop (llguidance drops the GIL while it compiles),
cached per constraint, and waited for at most CompileLimits.timeout_s: past it the request is
refused, never held (docs/api.md, "Structured outputs"; docs/hardening.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from llmserve.limits import MAX_GRAMMAR_BYTES
from llmserve.structured.compiler import CompileBusy, CompileLimits, GrammarCompiler, ll_tokenizer
from llmserve.structured.constraint import Constraint, ConstraintError
from scheduler_svc.api.validation import invalid
from scheduler_svc.core.tokenizer import Tokenizer
from scheduler_svc.messages import RequestError

def request_error(e: ConstraintError) -> RequestError:
    """The refusal a client gets: 429 / RESOURCE_EXHAUSTED when the compiler is busy (retry
    later), else 400 / INVALID_ARGUMENT naming the field."""
    if isinstance(e, CompileBusy):
        return RequestError("RESOURCE_EXHAUSTED", e.message, e.param)
    return invalid(e.message, e.param)


class GrammarCheck:
    """Compiles constraints for one tokenizer (one per API process: both doors share it, through
    their one Admission). The
    llguidance tokenizer is built by the compiler's first thread (~0.2-0.6 s for 49k ids);
    only verdicts are cached, not matchers (the executor builds its own)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: Sequence[int],
                 limits: CompileLimits = CompileLimits(), num_workers: int = 1):
        def build():
            return ll_tokenizer(tokenizer.hf.to_str(), vocab_size, tuple(eos_token_ids))

        self.compiler = GrammarCompiler(build, limits, num_workers, keep_matchers=False)

    async def check(self, constraint: Constraint) -> str:
        """The constraint's llguidance grammar text (what the executor is sent: made once, by
        the compile, off the loop) once it compiled; RequestError naming its field otherwise."""
        try:
            future = self.compiler.submit(constraint)
            compiled = await asyncio.wait_for(asyncio.wrap_future(future), self.compiler.limits.timeout_s)
        except TimeoutError:  # the compile goes on in its thread; its verdict will be cached
            raise request_error(self.compiler.timed_out(constraint)) from None
        except ConstraintError as e:
            raise request_error(e) from None
        size = len(compiled.grammar.encode("utf-8", "surrogatepass"))
        if size > MAX_GRAMMAR_BYTES:  # the executor's bound (the constraint's own keep it far below)
            raise invalid(f"{constraint.param} makes a grammar of {size} bytes, over the executor's "
                          f"{MAX_GRAMMAR_BYTES}; simplify it", constraint.param)
        return compiled.grammar

    def close(self) -> None:
        self.compiler.close()
