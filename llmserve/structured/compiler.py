"""Grammars compiled for one tokenizer: in the compiler's own threads (llguidance drops the GIL
while it builds a matcher), cached (bounded LRU), bounded in time and by llguidance's limits.

`GrammarCompiler.submit(spec)` takes a Constraint (the API checks a request's at admission) or
llguidance grammar text (what the executor is sent) and returns a Future of a CompiledGrammar;
a refused one raises ConstraintError naming the field and what is wrong. Identical specs share
one compilation and one cache entry (the LRU is bounded in entries and in bytes of text).

A compile that ran past `timeout_s` is refused, and stays refused from the cache (a schema does
not pass on a retry because the first try warmed something); one that waited past it in the
queue was never tried (`CompileBusy`: retry later). The threads have large stacks: deeply
chained rules recurse in llguidance (a 5,000-rule chain overflowed 8 MiB and killed the process).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from queue import SimpleQueue

import llguidance

from llmserve.structured.constraint import Constraint, ConstraintError, to_grammar
from llmserve.structured.matcher import Matcher, new_bitmask

THREAD_STACK_BYTES = 256 << 20  # address space only: a thread touches what it uses
Spec = Constraint | str


class CompileBusy(ConstraintError):
    """Not compiled: too many compilations queued, or this one waited past its time limit."""


@dataclass(frozen=True)
class CompileLimits:
    timeout_s: float = 5.0  # a compile (and its wait in the queue) may take this long
    max_pending: int = 64  # distinct compilations queued or running; one more is CompileBusy
    cache_entries: int = 256
    cache_bytes: int = 4 << 20  # of grammar text (and refusals) in the cache
    # llguidance's parser limits: lexer states bound a matcher's memory (~1-2 kB a state), the
    # Earley items per step each mask's time; a matcher that hits one while generating goes
    # into its error state (Matcher.error), where it allows only EOS.
    max_lexer_states: int = 50_000
    step_max_items: int = 50_000
    max_items_in_row: int = 2_000

    def parser_limits(self) -> llguidance.LLParserLimits:
        return llguidance.LLParserLimits(
            max_lexer_states=self.max_lexer_states, step_max_items=self.step_max_items,
            max_items_in_row=self.max_items_in_row, verbose_errors=False)


def ll_tokenizer(tokenizer_json: str, vocab_size: int, eos_token_ids: Sequence[int]) -> llguidance.LLTokenizer:
    """llguidance's tokenizer from a tokenizer.json's text (`tokenizers.Tokenizer.to_str()`),
    with the model's vocabulary size (the logits' width: masks cover it) and EOS ids. ~0.2 s
    for a 49k vocabulary: build it once, off any event loop."""
    tok = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=list(eos_token_ids))
    if tok.vocab_size != vocab_size:
        raise ValueError(f"the tokenizer has {tok.vocab_size} ids, the model's vocabulary {vocab_size}")
    return tok


class CompiledGrammar:
    """A grammar that compiled for the tokenizer: `grammar` (llguidance's text, to ship) and,
    when the compiler keeps them, a fresh matcher that `matcher()` copies (~5 µs)."""

    __slots__ = ("grammar", "vocab_size", "compile_s", "_proto")

    def __init__(self, grammar: str, proto, vocab_size: int, compile_s: float):
        self.grammar, self.vocab_size, self.compile_s, self._proto = grammar, vocab_size, compile_s, proto

    def matcher(self) -> Matcher:
        if self._proto is None:
            raise RuntimeError("this compiler keeps no matchers (keep_matchers=False)")
        return Matcher(self._proto.deep_copy(), self.vocab_size)


class _Job:
    __slots__ = ("spec", "future", "started")

    def __init__(self, spec: Spec):
        self.spec, self.future, self.started = spec, Future(), False


class GrammarCompiler:
    """Compiles constraints or grammar text for one tokenizer (see the module's docstring).
    `tokenizer` may be a function that builds it: the first worker calls it."""

    def __init__(self, tokenizer: llguidance.LLTokenizer | Callable[[], llguidance.LLTokenizer],
                 limits: CompileLimits = CompileLimits(), num_workers: int = 1,
                 keep_matchers: bool = True):
        self.limits, self.keep_matchers = limits, keep_matchers
        self._parser_limits = limits.parser_limits()
        self._tokenizer, self._tokenizer_error = tokenizer, None
        self._tokenizer_lock = threading.Lock()
        self._built = isinstance(tokenizer, llguidance.LLTokenizer)
        self._lock = threading.Lock()  # the cache and the jobs in flight
        self._cache: OrderedDict = OrderedDict()  # spec -> CompiledGrammar | str (the refusal)
        self._cache_bytes = 0
        self._inflight: dict[Spec, _Job] = {}
        self._jobs: SimpleQueue = SimpleQueue()
        self.hits = self.misses = 0
        self._closed = False
        old = threading.stack_size(THREAD_STACK_BYTES)
        try:
            self._threads = [threading.Thread(target=self._work, name=f"llmserve-grammar-{i}",
                                              daemon=True) for i in range(max(1, num_workers))]
            for t in self._threads:
                t.start()
        finally:
            threading.stack_size(old)

    def submit(self, spec: Spec) -> Future:
        """A Future of the CompiledGrammar, done at once on a cache hit, else when compiled; its
        exception is a ConstraintError naming the constraint's param ("grammar" for text).
        Cancelling it leaves the compilation to finish for the cache. CompileBusy at once
        when `max_pending` compilations are already queued or running."""
        future: Future = Future()
        with self._lock:
            cached = self._cache.get(spec)
            if cached is not None:
                self.hits += 1
                self._cache.move_to_end(spec)
                _resolve(future, cached, _param(spec))
                return future
            job = self._inflight.get(spec)
            if job is None:
                if self._closed:
                    raise CompileBusy(_param(spec), f"{_param(spec)}: the server is stopping; retry later")
                if len(self._inflight) >= self.limits.max_pending:
                    raise CompileBusy(_param(spec), f"{_param(spec)}: {len(self._inflight)} grammars "
                                      "are being compiled; retry later")
                self.misses += 1
                job = self._inflight[spec] = _Job(spec)
                self._jobs.put(job)
        job.future.add_done_callback(lambda done: _resolve(future, done.result(), _param(spec)))
        return future

    def compile(self, spec: Spec) -> CompiledGrammar:
        """submit(spec), waited for up to the time limit (blocking: never on an event loop)."""
        try:
            return self.submit(spec).result(timeout=self.limits.timeout_s)
        except TimeoutError:
            raise self.timed_out(spec) from None

    def timed_out(self, spec: Spec) -> ConstraintError:
        """What a caller whose wait ran out raises: CompileBusy if the compile never started."""
        with self._lock:
            job = self._inflight.get(spec)
        param = _param(spec)
        if job is not None and not job.started:
            return CompileBusy(param, f"{param}: the server is busy compiling other grammars; retry later")
        return ConstraintError(param, f"{param} takes longer than the {self.limits.timeout_s:g} s "
                               "limit to compile; simplify it")

    def close(self) -> None:
        """Stops the threads once the jobs queued are done (later submits are CompileBusy)."""
        with self._lock:
            self._closed = True
        for _ in self._threads:
            self._jobs.put(None)

    def _work(self) -> None:
        self._build_tokenizer()
        while (job := self._jobs.get()) is not None:
            job.started = True
            try:
                outcome = self._compile(job.spec)
            except BaseException as e:  # never leave a waiter waiting
                outcome = f"could not be compiled ({type(e).__name__}: {e})"
            with self._lock:
                del self._inflight[job.spec]
                self._store(job.spec, outcome)
            job.future.set_result(outcome)

    def _build_tokenizer(self) -> None:
        with self._tokenizer_lock:  # the first worker builds it, the others wait for it
            if not self._built:
                try:
                    self._tokenizer = self._tokenizer()
                except Exception as e:  # every job reports it
                    self._tokenizer_error = e
                self._built = True

    def _compile(self, spec: Spec) -> CompiledGrammar | str:
        """The compiled grammar, or why it is refused: words that follow the field's name."""
        if self._tokenizer_error is not None:
            return f"could not be compiled: the tokenizer did not load ({self._tokenizer_error})"
        tok = self._tokenizer
        start = time.perf_counter()
        try:
            grammar = spec if isinstance(spec, str) else to_grammar(spec)
            ll = llguidance.LLMatcher(tok, grammar, log_level=0, limits=self._parser_limits)
            if not ll.is_error():  # the first mask builds the lexer and meets the first limits
                probe = ll.deep_copy()
                Matcher(probe, tok.vocab_size).fill_bitmask(new_bitmask(1, tok.vocab_size))
                if probe.is_error():
                    ll = probe
        except ConstraintError as e:
            return e.message.removeprefix(e.param).lstrip(": ")
        except UnicodeError:
            return "is not valid UTF-8 text"
        except ValueError as e:  # llguidance's grammar_from_*: e.g. its JSON nesting limit
            return describe(spec, str(e))
        elapsed = time.perf_counter() - start
        if ll.is_error():
            return describe(spec, ll.get_error())
        if elapsed > self.limits.timeout_s:
            return (f"took {elapsed:.1f} s to compile, over the {self.limits.timeout_s:g} s limit; "
                    "simplify it")
        return CompiledGrammar(grammar, ll if self.keep_matchers else None, tok.vocab_size, elapsed)

    def _store(self, spec: Spec, outcome: CompiledGrammar | str) -> None:
        size = _size(outcome)
        if size > self.limits.cache_bytes:
            return
        self._cache[spec] = outcome
        self._cache_bytes += size
        while len(self._cache) > self.limits.cache_entries or self._cache_bytes > self.limits.cache_bytes:
            self._cache_bytes -= _size(self._cache.popitem(last=False)[1])


def describe(spec: Spec, error: str) -> str:
    """llguidance's error on one line (at most 400 characters), said of the constraint."""
    first = " ".join(line.strip() for line in error.splitlines() if line.strip())[:400] or "refused"
    kind = spec.kind if isinstance(spec, Constraint) else "grammar"
    if kind == "json" and first.startswith(("Unimplemented keys", "Unknown format", "Unsupported",
                                            "oneOf constraints are not supported")):
        return f"uses a JSON schema feature this server does not implement: {first}"
    what = {"json": "a JSON schema this server can compile", "regex": "a regex this server can "
            "compile (Rust syntax, no lookarounds)", "choice": "a list of choices this server can compile"}
    return f"is not {what.get(kind, 'a grammar this server can compile (Lark or GBNF)')}: {first}"


def _param(spec: Spec) -> str:
    return spec.param if isinstance(spec, Constraint) else "grammar"


def _size(outcome: CompiledGrammar | str) -> int:
    return len(outcome.grammar) if isinstance(outcome, CompiledGrammar) else len(outcome)


def _resolve(future: Future, outcome: CompiledGrammar | str, param: str) -> None:
    try:
        if isinstance(outcome, CompiledGrammar):
            future.set_result(outcome)
        else:
            future.set_exception(ConstraintError(param, f"{param} {outcome}"))
    except InvalidStateError:  # the caller cancelled it (its wait ran out)
        pass
