"""A verify step of token rows whose rows sample (temperature > 0, no cut) takes the random tail
(spec_decode/verify_tail.py: the rejection rule over every token row, then one kernel), and its
tokens are the scan path's for the same plans, accepted and rejected drafts and the bonus tokens
alike (CPU, fp32, tiny-llama: the kernels' references, the same rule and noise). Chained rows
take the same kernel as the greedy tail's (tests/kernels/test_verify_token_rows.py, with accept
flags; tests/executor/spec_decode/test_spec_chain.py)."""

from __future__ import annotations

from dataclasses import replace
from unittest import mock

import pytest

from executor_svc.sample.inputs import SampleStep
from executor_svc.spec_decode.verify_tail import GREEDY, RANDOM, tail_kind
from step_protocol.domain import NewRequestData, SamplerParams, StepPlan
from tests.executor.conftest import cached_rows, make_runner

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 3, 7, 2, 9, 4], [8, 8, 1, 2, 3, 4]]
# Two random rows (one nearly greedy: drafts from the greedy continuation are often accepted)
# and a greedy one; seeds over the wire's whole range.
PARAMS = [SamplerParams(temperature=0.2, seed=7), SamplerParams(), SamplerParams(temperature=0.9, seed=2**64 - 5)]
DRAFTS = [(3, 1, 2), (2, 3, 0), (1, 2, 3), (3, 3, 3), (2, 0, 1), (3, 2, 3)]  # per verify step, per request


def _new(params: list[SamplerParams]) -> list[NewRequestData]:
    return [NewRequestData(i + 1, p, sp, [3 * i + 1, 3 * i + 2, 3 * i + 3], 0, len(p))
            for i, (p, sp) in enumerate(zip(PROMPTS, params))]


def _greedy_continuations(runner, n: int) -> list[list[int]]:
    runner.reset()
    out = [[t] for t in runner.execute(StepPlan(0, new_requests=_new([SamplerParams()] * 3))).token_ids]
    for step in range(1, n):
        for seq, t in zip(out, runner.execute(StepPlan(step, cached_requests=cached_rows((1, 1), (2, 1), (3, 1))))
                          .token_ids):
            seq.append(t)
    return out


def _run(runner, refs: list[list[int]], seed_xor: int = 0, drafts=DRAFTS) -> list[tuple[list[int], list[int]]]:
    """Step 0, then a verify step per DRAFTS: each request's drafts are its greedy continuation
    (refs) after the tokens it has emitted (wrong once its draws left that path)."""
    runner.reset()
    r = runner.execute(StepPlan(0, new_requests=_new([replace(p, seed=p.seed ^ seed_xor) for p in PARAMS])))
    emitted = [[t] for t in r.token_ids]
    results = [(r.token_ids, r.num_tokens)]
    for step, counts in enumerate(drafts, start=1):
        drafts = [t for seq, ref, d in zip(emitted, refs, counts) for t in (ref + [0] * 16)[len(seq):len(seq) + d]]
        r = runner.execute(StepPlan(step, cached_requests=cached_rows(*((i + 1, 1 + d) for i, d in enumerate(counts))),
                                    num_draft_tokens=list(counts), draft_token_ids=drafts))
        results.append((r.token_ids, r.num_tokens))
        at = 0
        for seq, n in zip(emitted, r.num_tokens):
            seq += r.token_ids[at:at + n]
            at += n
    return results


@pytest.fixture(scope="module")
def runner(model_dirs):
    return make_runner(model_dirs["tiny-llama"], num_kv_blocks=32, block_size=16, max_num_seqs=16)  # 12 token rows


def test_the_random_tail_gives_the_scan_paths_tokens(runner):
    refs = _greedy_continuations(runner, 24)
    kinds, run_tail = [], runner.verifier.run_tail

    def spy(v, *args):
        kinds.append(v.tail)
        return run_tail(v, *args)

    runner.verifier.run_tail = spy
    try:
        tail = _run(runner, refs)
        with mock.patch("executor_svc.worker.model_runner.use_token_rows", return_value=False):
            scan = _run(runner, refs)
    finally:
        del runner.verifier.run_tail
    assert kinds == [RANDOM] * len(DRAFTS)  # every verify step of the first run, none of the second
    assert tail == scan
    emitted = [n for _, counts in tail[1:] for n in counts]
    drafted = [d + 1 for counts in DRAFTS for d in counts]
    assert any(0 < e < d for e, d in zip(emitted, drafted))  # some drafts rejected ...
    assert any(e == d > 1 for e, d in zip(emitted, drafted))  # ... and some rows accepted every draft


def test_the_tail_replays_the_seeded_draws(runner):
    """The same plans give the same tokens twice (the noise is the (seed, position) hash), and
    other seeds other tokens."""
    refs = _greedy_continuations(runner, 24)
    first = _run(runner, refs)
    assert _run(runner, refs) == first
    assert _run(runner, refs, seed_xor=1) != first


def test_tail_kind_is_the_plain_sampling_steps():
    base = dict(all_greedy=False, need_top_k_top_p=False)
    assert tail_kind(SampleStep(3, **base)) == RANDOM
    assert tail_kind(SampleStep(3, **(base | dict(all_greedy=True)))) == GREEDY
    for other in (dict(need_top_k_top_p=True), dict(need_processors=True), dict(need_masks=True),
                  dict(need_penalties=True), dict(num_logprobs=0)):
        assert tail_kind(SampleStep(3, **(base | other))) is None, other
