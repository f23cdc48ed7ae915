"""Adaptive speculation (core/spec/gate.py): requests whose drafts are not accepted stop
speculating (and waiting for their tokens in flight) and are probed now and then; with many
running requests (disable_by_batch_size) nobody speculates."""

from __future__ import annotations

import dataclasses

import pytest

from llmserve.speculative import parse_speculative_config
from scheduler_svc.core.spec import gate as spec_gate
from scheduler_svc.core.spec.gate import (
    LOOKUP_STEPS,
    MIN_ACCEPTED,
    PROBE_STEPS,
    SpecGate,
)
from tests.scheduler.core.spec import test_decoder
from tests.scheduler.core.spec.test_decoder import SPEC, drive, same
from tests.scheduler.sched_driver import fake_next_token, req


class R:  # what the gate reads of a request
    spec_gate = None


def fruitless_tries_to_stop(gate: SpecGate, r: R) -> int:
    n = 0
    while gate.speculates(r, 1):
        gate.observe(r, 0)
        n += 1
    return n


def test_fruitless_requests_stop_and_draft_model_probes_back_off():
    gate, r = SpecGate(4, probe=None), R()
    assert gate.speculates(r, 1)
    assert fruitless_tries_to_stop(gate, r) == 8  # 4 x 0.75^8 < 0.5
    decisions = [gate.speculates(r, 1) for _ in range(PROBE_STEPS)]
    assert decisions.index(True) == PROBE_STEPS - 2  # the first probe (the stop used a step)
    assert gate.speculates(r, 1)  # the probe holds until its outcome
    gate.observe(r, 0)
    decisions = [gate.speculates(r, 1) for _ in range(2 * PROBE_STEPS)]
    assert decisions.index(True) == 2 * PROBE_STEPS - 1  # fruitless: the interval doubled
    gate.observe(r, 4)  # accepted: back on, interval reset
    assert r.spec_gate.score >= MIN_ACCEPTED and r.spec_gate.interval == PROBE_STEPS


def test_ngram_probe_is_a_lookup_and_the_batch_bound():
    answers = []
    gate, r = SpecGate(2, probe=lambda request: answers.pop(0)), R()
    assert fruitless_tries_to_stop(gate, r) == 5  # 2 x 0.75^5 < 0.5
    answers[:] = [False, True]  # the first lookup finds nothing, the second a match
    decisions = [gate.speculates(r, 1) for _ in range(1 + 2 * LOOKUP_STEPS)]
    assert decisions == [False] * (2 * LOOKUP_STEPS - 2) + [True] * 3 and not answers
    gate.observe(r, 0)  # one fruitless try after a match: off again
    assert not gate.speculates(r, 1)
    assert not SpecGate(2, None, disable_by_batch_size=4).speculates(R(), 5)
    assert SpecGate(2, None, disable_by_batch_size=4).speculates(R(), 4)
    config = parse_speculative_config('{"num_speculative_tokens": 2, "disable_by_batch_size": 8}')
    assert config.disable_by_batch_size == 8
    with pytest.raises(ValueError):
        parse_speculative_config('{"num_speculative_tokens": 2, "disable_by_batch_size": 0}')


def arrivals():
    """Eight requests of text with no repeats to look up (the model's tokens look random)."""
    return {0: [req(i, [(i * 11 + j * 7) % 29 for j in range(6)], max_tokens=40, ignore_eos=True)
                for i in range(8)]}


@pytest.mark.parametrize("gated", [True, False])
def test_unrepetitive_text_keeps_its_pipelining(monkeypatch, gated):
    """Nothing to propose: the gate turns speculation off after a few fruitless tries, so the
    requests decode pipelined (about the steps of no speculation); without the gate each waits
    for its token in flight every step (about twice the steps at depth 3)."""
    monkeypatch.setattr(test_decoder, "model", fake_next_token)
    if not gated:
        monkeypatch.setattr(spec_gate, "MIN_ACCEPTED", 0.0)
    spec = dataclasses.replace(SPEC, prompt_lookup_min=3)
    reference, ref_plans, _ = drive(None, arrivals(), depth=3, max_model_len=64)
    streams, plans, _ = drive(spec, arrivals(), depth=3, max_model_len=64)
    assert same(streams, reference)
    steps, ref_steps = sum(p.has_rows() for p in plans), sum(p.has_rows() for p in ref_plans)
    if gated:
        assert steps <= ref_steps + 6, (steps, ref_steps)
    else:
        assert steps >= ref_steps + 15, (steps, ref_steps)


def test_repetitive_text_still_speculates(monkeypatch):
    """A repeated passage broken every 7th token (the fake model): the gate rides out the failed
    lookups after each break, within a few steps of speculating always."""
    def steps_and_accepted():
        streams, plans, s = drive(SPEC, {0: [req(0, [1, 2, 3] * 5, max_tokens=40, ignore_eos=True)]})
        return sum(p.has_rows() for p in plans), s.spec.stats.num_accepted_tokens

    steps, accepted = steps_and_accepted()
    monkeypatch.setattr(spec_gate, "MIN_ACCEPTED", 0.0)
    always_steps, always_accepted = steps_and_accepted()
    assert accepted >= 15 and steps <= always_steps + 3 < 40, (steps, always_steps)
