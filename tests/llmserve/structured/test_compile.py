"""Compilation: cached per (constraint, tokenizer), refused by name (tests/data/structured/
refused.json: unsupported keywords and formats, bad regexes and grammars), bounded in size and
time (never a hang), off the caller's thread with the GIL dropped, safe with deep recursion."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from benchmarks.structured_walk import corpus
from llmserve.structured import constraint as sc
from llmserve.structured.compiler import CompileBusy, CompileLimits, GrammarCompiler

BUILD = {"json": sc.json_schema, "regex": sc.regex, "grammar": sc.grammar, "choice": sc.choice}


def _nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def _many_properties(n: int) -> dict:
    return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}


@pytest.mark.parametrize("entry", corpus("refused"), ids=lambda e: e["name"])
def test_refused_naming_the_field_and_the_feature(tiny_compiler, entry):
    spec = _nested(200) if entry["spec"] == "NESTED:200" else entry["spec"]
    with pytest.raises(sc.ConstraintError) as e:
        tiny_compiler.compile(BUILD[entry["kind"]](spec, "response_format.json_schema.schema"))
    assert e.value.param == "response_format.json_schema.schema"
    assert str(e.value).startswith("response_format.json_schema.schema ")
    assert entry["says"] in str(e.value), str(e.value)


def test_cached_per_constraint_whatever_field_it_came_from(tiny_compiler):
    c = sc.json_schema({"type": "object", "properties": {"cached": {"type": "integer"}}}, "a")
    hits, misses = tiny_compiler.hits, tiny_compiler.misses
    first = tiny_compiler.compile(c)
    again = tiny_compiler.compile(sc.json_schema('{"type": "object", "properties": {"cached": {"type": "integer"}}}', "b"))
    assert again is first and (tiny_compiler.hits, tiny_compiler.misses) == (hits + 1, misses + 1)
    compact = tiny_compiler.compile(dataclasses.replace(c, whitespace="compact"))
    assert compact is not first  # options are part of the key
    refused = sc.regex("(cached", "x")
    with pytest.raises(sc.ConstraintError):
        tiny_compiler.compile(refused)
    with pytest.raises(sc.ConstraintError) as e:  # a refusal is cached too, named for its caller
        tiny_compiler.compile(refused.at("structured_outputs.regex"))
    assert e.value.param == "structured_outputs.regex" and tiny_compiler.hits == hits + 2


def test_the_cache_is_bounded_in_entries_and_bytes(tiny_ll):
    compiler = GrammarCompiler(tiny_ll, CompileLimits(cache_entries=3, cache_bytes=1 << 20))
    for i in range(5):
        compiler.compile(sc.regex(f"a{{{i + 1}}}", "r"))
    assert len(compiler._cache) == 3
    compiler.compile(sc.regex("a{5}", "r"))
    assert compiler.hits == 1
    compiler.compile(sc.regex("a{1}", "r"))  # evicted: compiled again
    assert compiler.misses == 6
    small = GrammarCompiler(tiny_ll, CompileLimits(cache_bytes=2_000))
    for i in range(20):
        small.compile(sc.choice([f"choice{i}-{j}" for j in range(10)], "c"))
    assert small._cache_bytes <= 2_000
    compiler.close(), small.close()


def test_size_limits_refuse_before_compiling():
    with pytest.raises(sc.ConstraintError) as e:
        sc.json_schema({"enum": ["x" * 1000] * 70}, "guided_json")
    assert e.value.param == "guided_json" and "the limit is 65536" in str(e.value)
    with pytest.raises(sc.ConstraintError, match="the limit is 1024"):
        sc.choice(["a"] * 1025, "guided_choice")
    with pytest.raises(sc.ConstraintError, match="not valid JSON"):
        sc.json_schema("{", "structured_outputs.json")
    with pytest.raises(sc.ConstraintError, match="must be a JSON object"):
        sc.json_schema("[]", "structured_outputs.json")
    with pytest.raises(sc.ConstraintError, match="nested too deeply"):
        sc.json_schema("[" * 30_000 + "]" * 30_000, "structured_outputs.json")
    with pytest.raises(sc.ConstraintError, match="is empty"):
        sc.regex("", "structured_outputs.regex")


def test_a_slow_compile_is_refused_in_time_and_stays_refused(tiny_ll):
    """2,000 optional properties take ~0.3 s here; with a 50 ms limit the caller is refused at
    the limit (the compile finishes in its thread) and later callers are refused from the cache."""
    compiler = GrammarCompiler(tiny_ll, CompileLimits(timeout_s=0.05))
    slow = sc.json_schema(_many_properties(2000), "response_format.json_schema.schema")
    start = time.monotonic()
    with pytest.raises(sc.ConstraintError, match="takes longer than the 0.05 s limit") as e:
        compiler.compile(slow)
    assert time.monotonic() - start < 0.5 and not isinstance(e.value, CompileBusy)
    deadline = time.monotonic() + 30
    while slow not in compiler._cache and time.monotonic() < deadline:
        time.sleep(0.02)
    with pytest.raises(sc.ConstraintError, match=r"took \d+\.\d s to compile, over the 0.05 s limit"):
        compiler.compile(slow)
    compiler.close()


def test_a_full_queue_is_busy_not_a_hang(tiny_ll):
    compiler = GrammarCompiler(tiny_ll, CompileLimits(timeout_s=0.05, max_pending=2))
    slow = [sc.json_schema(_many_properties(1500 + i), "guided_json") for i in range(3)]
    futures = [compiler.submit(s) for s in slow[:2]]
    with pytest.raises(CompileBusy, match="retry later"):
        compiler.submit(slow[2])
    with pytest.raises(CompileBusy, match="busy compiling other grammars"):  # queued, never started
        compiler.compile(slow[1])
    for f in futures:
        with pytest.raises(sc.ConstraintError):
            f.result(timeout=60)
    compiler.close()


def test_compiling_drops_the_gil(tiny_ll):
    """A Python thread keeps running while a slow grammar compiles (the event loop would)."""
    compiler = GrammarCompiler(tiny_ll, CompileLimits(timeout_s=60))
    ticks, stop = [0], threading.Event()

    def tick():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    ticker = threading.Thread(target=tick)
    ticker.start()
    start = time.monotonic()
    future = compiler.submit(sc.json_schema(_many_properties(1200), "json"))
    before = ticks[0]
    future.result(timeout=60)
    elapsed = time.monotonic() - start
    stop.set()
    ticker.join()
    assert elapsed > 0.05 and ticks[0] - before >= elapsed * 1000 * 0.3, (elapsed, ticks[0] - before)
    compiler.close()


def test_deep_recursion_in_llguidance_does_not_kill_the_process(tiny, tiny_compiler):
    """A 5,000-rule chain (62 KB) overflowed an 8 MiB thread stack (SIGSEGV); the compiler's
    threads have 256 MiB of address space for their stacks."""
    chain = "start: r0\n" + "\n".join(f"r{i}: r{i + 1}" for i in range(5000)) + '\nr5000: "a"'
    grammar = tiny_compiler.compile(sc.grammar(chain, "grammar"))
    m = grammar.matcher()
    assert m.consume(tiny.encode("a", add_special_tokens=False)) and m.is_accepting()
