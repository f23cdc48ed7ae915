"""Structured outputs on the executor (sample/grammar.py through the runner, CPU): every sampled
token follows the row's grammar (logits processors such as min_p see only its allowed tokens), pipelined launches advance the matchers in order, greedy output
under a grammar equals the unconstrained output wherever that output satisfies it, a preempted
request resumes its grammar, and a grammar that cannot be used fails its request alone."""

from __future__ import annotations

import re

import pytest
from tokenizers import Tokenizer

from llmserve.structured import choice, regex, to_grammar
from step_protocol.domain import NewRequestData, SamplerParams, StepPlan
from tests.executor.conftest import cached_rows, decode_rows, make_runner

PROMPT = [5, 17, 99, 3, 250, 8]


@pytest.fixture(scope="module")
def runner(model_dirs):
    return make_runner(model_dirs["tiny-llama"])


@pytest.fixture(scope="module")
def tokenizer(model_dirs):
    return Tokenizer.from_file(str(model_dirs["tiny-llama"] / "tokenizer.json"))


def generate(runner, params: SamplerParams, steps: int, req_id: int = 1, ahead: bool = False,
             prompt: list[int] = PROMPT) -> list[int]:
    """Tokens of one request over `steps` steps (ahead: each step launched before the last one is
    finished, as the pipeline does); stops after EOS."""
    runner.reset()
    eos = set(runner.info().eos_token_ids)
    out = runner.execute(StepPlan(0, [NewRequestData(req_id, prompt, params, [1, 2, 3, 4], 0, len(prompt))]))
    tokens = [out.sampled()[req_id]]
    pending = []
    for step in range(1, steps):
        if tokens[-1] in eos:
            break
        pending.append(runner.launch(StepPlan(step, cached_requests=decode_rows([req_id]))))
        if not ahead or len(pending) == 2:
            result = runner.finish(pending.pop(0))
            assert not result.failed_req_ids, result.failed_errors
            tokens.append(result.sampled()[req_id])
    for handle in pending:
        tokens.append(runner.finish(handle).sampled()[req_id])
    runner.reset()
    return tokens


def text_of(tokenizer, tokens: list[int], eos: set[int]) -> str:
    return tokenizer.decode([t for t in tokens if t not in eos], skip_special_tokens=False)


@pytest.mark.parametrize("ahead", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampled_tokens_follow_a_regex(runner, tokenizer, ahead, seed):
    grammar = to_grammar(regex(r"[0-9]{2,4}-[a-c]+", "regex"))
    params = SamplerParams(temperature=1.0, seed=seed, grammar=grammar)
    tokens = generate(runner, params, 40, ahead=ahead)
    eos = set(runner.info().eos_token_ids)
    assert tokens[-1] in eos  # the grammar ended the output
    assert re.fullmatch(r"[0-9]{2,4}-[a-c]+", text_of(tokenizer, tokens, eos))


@pytest.mark.parametrize("seed", [0, 1])
def test_min_p_cuts_among_the_tokens_the_grammar_allows(runner, tokenizer, seed):
    """min_p = 1 keeps only the most likely token: the most likely the grammar allows, not the
    vocabulary's (cut first, every allowed token was gone: the row sampled outside its grammar)."""
    grammar = to_grammar(regex(r"[0-9]{2,4}-[a-c]{1,3}", "regex"))
    params = SamplerParams(temperature=1.0, seed=seed, grammar=grammar, min_p=1.0, repetition_penalty=1.1)
    tokens = generate(runner, params, 40, ahead=True)
    eos = set(runner.info().eos_token_ids)
    assert tokens[-1] in eos and re.fullmatch(r"[0-9]{2,4}-[a-c]{1,3}", text_of(tokenizer, tokens, eos))


def test_a_choice_is_one_of_the_choices(runner, tokenizer):
    options = ["alpha", "beta gamma", "delta"]
    eos = set(runner.info().eos_token_ids)
    for seed in range(4):
        params = SamplerParams(temperature=1.0, seed=seed, grammar=to_grammar(choice(options, "choice")))
        assert text_of(tokenizer, generate(runner, params, 30, ahead=True), eos) in options


def test_greedy_under_a_grammar_it_satisfies_equals_greedy_without(runner, tokenizer):
    """The unconstrained greedy tokens, as far as each decodes to whole characters on its own
    (a byte-level token of half a character has no text to write a regex of), then the same
    request under the regex of exactly that text: the same tokens, then EOS."""
    eos = set(runner.info().eos_token_ids)
    checked = 0
    for first in range(5, 60):
        prompt = [first, *PROMPT[1:]]
        clean = []
        for t in generate(runner, SamplerParams(), 8, prompt=prompt):
            piece = tokenizer.decode([t], skip_special_tokens=False)
            if t in eos or not piece or "\ufffd" in piece or (piece.startswith("<") and tokenizer.token_to_id(piece) == t):
                break  # EOS, half a character, or a special token's name
            clean.append(t)
        if len(clean) < 3:
            continue
        text = tokenizer.decode(clean, skip_special_tokens=False)
        grammar = to_grammar(regex(re.escape(text), "regex"))
        constrained = generate(runner, SamplerParams(grammar=grammar), 12, prompt=prompt)
        assert constrained[:len(clean)] == clean and constrained[len(clean)] in eos, (first, text)
        checked += 1
        if checked == 3:
            break
    assert checked == 3


def test_a_preempted_request_resumes_its_grammar(runner, tokenizer):
    grammar = to_grammar(regex(r"[0-9]{6}", "regex"))
    params = SamplerParams(temperature=1.0, seed=5, grammar=grammar)
    whole = generate(runner, params, 10)
    runner.reset()
    out = runner.execute(StepPlan(0, [NewRequestData(1, PROMPT, params, [1, 2, 3, 4], 0, len(PROMPT))]))
    first = [out.sampled()[1], runner.execute(StepPlan(1, cached_requests=decode_rows([1]))).sampled()[1]]
    # preempted after two tokens, sent again with them (recomputed from the prompt)
    again = NewRequestData(1, PROMPT + first, params, [5, 6, 7, 8], 0, len(PROMPT) + 2, len(PROMPT))
    rest = [runner.execute(StepPlan(2, [again], preempted_req_ids=[1])).sampled()[1]]
    eos = set(runner.info().eos_token_ids)
    for step in range(3, 12):
        if rest[-1] in eos:
            break
        rest.append(runner.execute(StepPlan(step, cached_requests=decode_rows([1]))).sampled()[1])
    runner.reset()
    assert first + rest == whole and re.fullmatch(r"[0-9]{6}", text_of(tokenizer, whole, eos))


def test_a_grammar_that_cannot_be_used_fails_its_request_alone(runner):
    runner.reset()
    bad = SamplerParams(grammar="start: this is not ((( a grammar")
    plan = StepPlan(0, [NewRequestData(1, PROMPT, bad, [1, 2], 0, len(PROMPT)),
                        NewRequestData(2, PROMPT, SamplerParams(), [3, 4], 0, len(PROMPT))])
    out = runner.execute(plan)
    assert out.failed_req_ids == [1] and "grammar" in out.failed_errors[0]
    assert set(out.sampled()) == {1, 2}  # it ran this step (EOS only); the scheduler aborts it
    eos = set(runner.info().eos_token_ids)
    assert out.sampled()[1] in eos
    again = runner.execute(StepPlan(1, cached_requests=decode_rows([1, 2])))
    assert not again.failed_req_ids and again.sampled()[1] in eos  # reported once, EOS only
    runner.reset()


def test_a_row_given_to_another_request_mid_pipeline_does_not_consume_the_old_token(runner, tokenizer):
    """The row-epoch race: request 1's last step is still in flight when the next plan finishes
    it and gives its row to request 2 (another grammar). Request 1's digit, consumed later, must
    not reach request 2's matcher (letters only: it would refuse the digit and fail request 2)."""
    runner.reset()
    digits = SamplerParams(temperature=1.0, seed=3, grammar=to_grammar(regex(r"[0-9]{30}", "regex")))
    letters = SamplerParams(temperature=1.0, seed=4, grammar=to_grammar(regex(r"[a-c]{6}", "regex")))
    runner.execute(StepPlan(0, [NewRequestData(1, PROMPT, digits, [1, 2, 3, 4], 0, len(PROMPT))]))
    row = int(runner.batch.rows_of([1])[0])
    in_flight = runner.launch(StepPlan(1, cached_requests=decode_rows([1])))  # request 1's digit
    handles = [runner.launch(StepPlan(2, [NewRequestData(2, PROMPT, letters, [5, 6, 7, 8], 0, len(PROMPT))],
                                      finished_req_ids=[1]))]
    assert int(runner.batch.rows_of([2])[0]) == row  # the same row, another request
    first = runner.finish(in_flight)
    assert not first.failed_req_ids and tokenizer.decode([first.sampled()[1]]).isdigit()
    eos = set(runner.info().eos_token_ids)
    tokens = []
    for step in range(3, 14):
        result = runner.finish(handles.pop(0))
        assert not result.failed_req_ids, result.failed_errors
        tokens.append(result.sampled()[2])
        if tokens[-1] in eos:
            break
        handles.append(runner.launch(StepPlan(step, cached_requests=decode_rows([2]))))
    for handle in handles:
        runner.finish(handle)
    runner.reset()
    assert tokens[-1] in eos and re.fullmatch(r"[a-c]{6}", text_of(tokenizer, tokens, eos))


def test_drafts_on_a_grammar_row_are_refused_and_fail_it_alone(runner):
    """Speculation is off for constrained rows by design (the scheduler never proposes them,
    scheduler_svc/core/spec/decoder.eligible): a plan that gives one drafts fails that request
    alone; an unconstrained row in the same plan verifies its drafts."""
    runner.reset()
    constrained = SamplerParams(grammar=to_grammar(regex(r"[0-9]{30}", "regex")))
    runner.execute(StepPlan(0, [NewRequestData(1, PROMPT, constrained, [1, 2], 0, len(PROMPT)),
                                NewRequestData(2, PROMPT, SamplerParams(), [3, 4], 0, len(PROMPT))]))
    plan = StepPlan(1, cached_requests=cached_rows((1, 3)))
    plan.add_drafts([7, 8])
    plan.cached_requests.append(2, 3, [])
    plan.add_drafts([7, 8])
    out = runner.execute(plan)
    assert out.failed_req_ids == [1] and "without logits processors, logprobs or a grammar" in out.failed_errors[0]
    assert 1 not in out.sampled() and 2 in out.sampled() and 1 not in runner.batch.requests
    runner.reset()


def test_unconstrained_rows_beside_constrained_ones_are_untouched(runner, tokenizer):
    """Greedy rows give the same tokens whether constrained rows share their steps (which then
    sample eagerly, pipelined) or not; the constrained rows follow their regex."""
    pattern = r"[0-9]{3}-[a-c]{3}"
    constrained = SamplerParams(temperature=1.0, seed=9, grammar=to_grammar(regex(pattern, "regex")))
    prompts = {r: [5 + r, 17, 99, 3 * r, 250, 8] for r in range(1, 5)}

    def run(req_ids: list[int]) -> dict[int, list[int]]:
        runner.reset()
        new = [NewRequestData(r, prompts[r], constrained if r % 2 else SamplerParams(),
                              [4 * r + i for i in range(1, 5)], 0, len(prompts[r])) for r in req_ids]
        out = runner.execute(StepPlan(0, new))
        tokens = {r: [out.sampled()[r]] for r in req_ids}
        pending = [runner.launch(StepPlan(1, cached_requests=decode_rows(req_ids)))]
        for step in range(2, 10):
            pending.append(runner.launch(StepPlan(step, cached_requests=decode_rows(req_ids))))
            result = runner.finish(pending.pop(0))
            assert not result.failed_req_ids, result.failed_errors
            for r in req_ids:
                tokens[r].append(result.sampled()[r])
        result = runner.finish(pending.pop(0))
        for r in req_ids:
            tokens[r].append(result.sampled()[r])
        runner.reset()
        return tokens

    together, alone = run([1, 2, 3, 4]), run([2, 4])
    assert together[2] == alone[2] and together[4] == alone[4]
    eos = set(runner.info().eos_token_ids)
    for r in (1, 3):  # EOS ends them: the rest of their row's tokens are EOS only
        cut = together[r][:together[r].index(next(t for t in together[r] if t in eos)) + 1]
        assert re.fullmatch(pattern, text_of(tokenizer, cut, eos)), together[r]
