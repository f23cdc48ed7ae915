"""Structured outputs at admission (in process): a constraint is compiled after every cheaper
check, off the event loop, within its time limit; one that compiles crosses to the core with
the request's params and its grammar text, made once by that compile."""

from __future__ import annotations

import asyncio
import pickle
import time
from types import SimpleNamespace

import pytest

from llmserve.structured import constraint as sc
from llmserve.structured.compiler import CompileLimits
from scheduler_svc.api import structured
from scheduler_svc.api.admission import Admission
from scheduler_svc.api.http.errors import status_of
from scheduler_svc.api.prompts import TokenIdsPrompt
from scheduler_svc.api.request_params import RawParams
from scheduler_svc.api.structured import GrammarCheck
from scheduler_svc.api.tokenize_pool import TokenizePool
from scheduler_svc.api.validation import SizeLimits
from scheduler_svc.core.request import Request
from scheduler_svc.messages import AddRequest, RequestError
from step_protocol.domain import ExecutorInfo

INFO = ExecutorInfo("tiny", "", vocab_size=512, eos_token_ids=(1,), max_model_len=2048, block_size=16,
                    num_blocks=512, cuda_graph_sizes=(), max_num_seqs=64, max_num_batched_tokens=2048,
                    device="cpu", dtype="float32")
PROMPT = TokenIdsPrompt([5, 6, 7])
PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def _slow(n: int) -> sc.Constraint:  # optional properties: compile time grows with n squared
    return sc.json_schema({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}},
                          "response_format.json_schema.schema")


@pytest.fixture
def admission(tok):
    pool = TokenizePool(tok, num_workers=1, max_pending=8)
    engine = SimpleNamespace(info=INFO, num_requests=0)
    yield Admission(engine, pool, SizeLimits(), max_waiting=8)
    pool.close()


def _admit(admission, constraint, **raw):
    return asyncio.run(admission.admit(PROMPT, RawParams(max_tokens=8, constraint=constraint, **raw), ""))


def test_a_constraint_that_compiles_is_admitted_with_the_request(admission):
    c = sc.json_schema(PERSON, "response_format.json_schema.schema")
    prompt_ids, params = _admit(admission, c)
    assert params.constraint == c and params.constraint.param == c.param
    message = pickle.loads(pickle.dumps(AddRequest(1, prompt_ids, params)))  # the pipe's framing
    request = Request(1, message.prompt_token_ids, message.params)
    assert request.params.constraint == c
    # the grammar text the executor gets is made once, by the compile (not per plan)
    assert params.grammar == sc.to_grammar(c) and request.sampler_params(INFO.eos_token_ids).grammar == params.grammar
    misses = admission.grammars.compiler.misses
    assert _admit(admission, sc.json_schema(PERSON, "response_format.json_schema.schema"))[1].grammar == params.grammar
    assert admission.grammars.compiler.misses == misses  # a cache hit
    unconstrained = _admit(admission, None)[1]
    assert unconstrained.constraint is None and unconstrained.grammar == ""


def test_cheaper_checks_come_first_and_a_bad_constraint_names_its_field(admission):
    grammars = admission.grammars
    misses = grammars.compiler.misses
    with pytest.raises(RequestError) as e:  # refused on temperature: never compiled
        _admit(admission, _slow(900), temperature=-1.0)
    assert e.value.param == "temperature" and grammars.compiler.misses == misses
    with pytest.raises(RequestError) as e:
        _admit(admission, sc.regex("a(?=b)", "structured_outputs.regex"))
    assert e.value.code == "INVALID_ARGUMENT" and e.value.param == "structured_outputs.regex"
    assert "look-around" in e.value.message
    for field in ("min_tokens", "ignore_eos"):
        with pytest.raises(RequestError) as e:
            _admit(admission, sc.choice(["a"], "guided_choice"), **{field: 2 if field == "min_tokens" else True})
        assert e.value.param == field and "guided_choice" in e.value.message


def test_compiling_never_holds_the_event_loop(tok):
    pool = TokenizePool(tok, num_workers=1, max_pending=8)
    admission = Admission(SimpleNamespace(info=INFO, num_requests=0), pool, SizeLimits(), max_waiting=8)

    async def run():
        ticks, gaps = 0, []

        async def ticker():
            nonlocal ticks
            last = time.perf_counter()
            while True:
                await asyncio.sleep(0.001)
                now = time.perf_counter()
                gaps.append(now - last)
                last, ticks = now, ticks + 1

        task = asyncio.create_task(ticker())
        start = time.perf_counter()
        await admission.admit(PROMPT, RawParams(max_tokens=8, constraint=_slow(1200)), "")
        elapsed = time.perf_counter() - start
        task.cancel()
        return elapsed, ticks, max(gaps)

    elapsed, ticks, worst = asyncio.run(run())
    assert elapsed > 0.05 and ticks >= elapsed * 1000 * 0.3 and worst < 0.25, (elapsed, ticks, worst)
    pool.close()


def test_past_the_time_limit_refused_and_a_full_queue_is_429(tok):
    slow = GrammarCheck(tok, INFO.vocab_size, INFO.eos_token_ids, CompileLimits(timeout_s=0.05, max_pending=1))

    async def run():
        await slow.check(sc.regex("warm", "regex"))  # the tokenizer is built by now
        start = time.perf_counter()
        with pytest.raises(RequestError) as late:
            await slow.check(_slow(1500))
        took = time.perf_counter() - start
        with pytest.raises(RequestError) as busy:  # the first is still compiling in its thread
            await slow.check(_slow(1501))
        return late.value, took, busy.value

    late, took, busy = asyncio.run(run())
    assert late.code == "INVALID_ARGUMENT" and "takes longer than the 0.05 s limit" in late.message, late.message
    assert took < 1.0
    assert busy.code == "RESOURCE_EXHAUSTED" and status_of(busy) == 429, busy.message
    slow.close()
