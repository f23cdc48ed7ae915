"""The start-up warm-up (executor_svc/startup/warmup.py, warmup_plans.py) on CPU: its classes,
that its plans cover each eager shape and sampling path, and that a real runner runs every plan
(no failed row)."""

from __future__ import annotations

import logging

import pytest

from executor_svc.startup import warmup, warmup_plans
from executor_svc.startup.warmup_plans import (
    WarmupPlans,
    WarmupShapes,
    representatives,
    request_class,
    runs_eager,
    token_class,
)
from executor_svc.worker.cuda_graphs import GraphRunner
from tests.executor.conftest import make_runner

DECODE, MIXED = (1, 2, 4, 8, 16, 32, 64), (32, 64, 96, 128, 256, 512, 1024)


def shapes(**kw) -> WarmupShapes:
    base = dict(max_num_seqs=64, max_num_tokens=2048, max_tokens_per_req=1000, block_size=16,
                vocab_size=512, max_logprobs=20, decode_sizes=DECODE, mixed_sizes=MIXED, grammar="g")
    return WarmupShapes(**{**base, **kw})


def steps(scenarios):
    """(tokens, requests, sampled rows) of every plan, as the runner will count them."""
    out = []
    for plans in scenarios:
        for p in plans:
            sample = sum(n.num_scheduled_tokens == len(n.token_ids) for n in p.new_requests)
            out.append((p.num_scheduled_tokens, len(p.scheduled_req_ids), sample + len(p.cached_requests)))
    return out


def test_classes_are_trivial_specialization_and_the_row_buckets():
    assert representatives(1, 200) == [1, 2, 3, 5, 9, 16, 17, 32, 33, 48, 65, 80, 129, 144, 200]
    assert representatives(1025, 8192) == [1025, 1040, 8192]  # past 1024 rows: x % 16 alone
    assert representatives(1, 1024, request_class)[-3:] == [513, 528, 1024]  # depth and row bucket past 512
    assert representatives(5, 3) == [] and representatives(7, 7) == [7]
    assert token_class(1) != token_class(2) and token_class(3) == token_class(4) and token_class(48) != token_class(47)


def test_runs_eager_is_the_graph_runners_rule():
    graphs = object.__new__(GraphRunner)  # shape_for reads the sizes and shapes alone
    graphs.sizes, graphs.mixed_sizes = list(DECODE), list(MIXED[:3])
    graphs.decode_shapes = [("decode", s) for s in DECODE]
    graphs.mixed_shapes = [("mixed", t) for t in MIXED[:3]]

    class Step:
        def __init__(self, t, b):
            self.num_tokens, self.num_reqs, self.is_decode = t, b, t == b

    for t in range(1, 200):
        for b in {1, t // 2, t}:
            if 1 <= b <= t:
                assert runs_eager(t, b, DECODE, MIXED[:3]) == (graphs.shape_for(Step(t, b)) is None), (t, b)
    assert runs_eager(5, 2, (), ()) and runs_eager(3, 3, (), ())


def test_eager_steps_cover_every_token_and_request_class():
    s = shapes(max_tokens_per_req=2040)
    got = steps(WarmupPlans(s).size_scenarios())
    assert all(runs_eager(t, b, DECODE, MIXED) for t, b, _ in got)
    assert {token_class(t) for t, _, _ in got} == {token_class(t) for t in range(1025, 2049)}
    assert {request_class(n) for _, _, n in got} == {request_class(b) for b in range(1, 65)}
    assert max(t for t, _, _ in got) == 2048  # the largest step
    assert all(-(-t // b) <= s.max_tokens_per_req for t, b, _ in got)
    short = steps(WarmupPlans(shapes(max_tokens_per_req=1000)).size_scenarios())  # 1 request can't hold 1025
    assert min(b for _, b, _ in short) == 2 and all(-(-t // b) <= 1000 for t, b, _ in short)


def test_decode_steps_only_past_the_graphs_one_per_variant():
    assert WarmupPlans(shapes()).decode_scenarios() == []  # every batch has its graph
    small = shapes(decode_sizes=(1, 2, 4), mixed_sizes=(32,))
    sizes = [steps([sc])[0][1] for sc in WarmupPlans(small).decode_scenarios()]
    assert sizes == representatives(33, 64, request_class)
    drafted = shapes(decode_sizes=(1, 2, 4), mixed_sizes=(32,), draft_model=True)  # its catch-ups
    assert [steps([sc])[0][1] for sc in WarmupPlans(drafted).decode_scenarios()][0] == 5
    keyed = shapes(decode_sizes=(), mixed_sizes=(), decode_key=lambda b: b >= 40)
    sizes = [steps([sc])[0][1] for sc in WarmupPlans(keyed).decode_scenarios()]
    assert 40 in sizes and sizes[0] == 1 and sizes[-1] == 64
    for sc in WarmupPlans(keyed).decode_scenarios():  # 1-token prompts (a decode step), then decode
        assert [(t, b) for t, b, _ in steps([sc])] == [(len(sc[0].new_requests),) * 2] * 2


def test_sampling_paths_after_a_mixed_graph_a_decode_graph_and_an_eager_forward():
    classes = warmup_plans.sampling_classes(shapes())
    assert set(classes) == {"plain", "top-k/top-p", "processors", "logprobs", "grammar", "grammar, top-k",
                            "grammar, processors"}
    assert "grammar" not in warmup_plans.sampling_classes(shapes(grammar=""))
    for sc, params in zip(WarmupPlans(shapes()).sampling_scenarios(), classes.values()):
        grammar = any(p.grammar for p in params)  # no second decode step: its tokens could complete it
        (t1, b1, _), (t2, b2, _), *steady, (t4, b4, _) = steps([sc])
        assert not runs_eager(t1, b1, DECODE, MIXED) and t2 == b2 and runs_eager(t4, b4, DECODE, MIXED)
        assert steady == ([] if grammar else [(t2, b2, steady[0][2])])
        if not grammar:  # the same rows again: a steady step
            assert sc[2].cached_requests.req_ids == sc[1].cached_requests.req_ids
    without_graphs = WarmupPlans(shapes(decode_sizes=(), mixed_sizes=())).sampling_scenarios()
    assert [len(sc) for sc in without_graphs] == [2 + (not any(p.grammar for p in ps)) for ps in classes.values()]


def test_nothing_when_no_request_fits():
    assert WarmupPlans(shapes(max_tokens_per_req=1)).scenarios() == []


def test_warm_up_runs_on_cpu_only_when_asked(model_dirs, monkeypatch):
    runner = make_runner(model_dirs["tiny-llama"])
    monkeypatch.setattr(warmup, "shapes_of", lambda r: pytest.fail("planned on CPU"))
    warmup.warm_up(runner)  # a no-op


@pytest.mark.parametrize("max_num_seqs", [1, 2, 3, 64])
def test_no_scenario_holds_more_requests_than_max_num_seqs(max_num_seqs):
    """A sampling class of two rows used to warm up as one step: --max-num-seqs 1 failed at
    start on CUDA (`2 scheduled requests > max_num_seqs 1`). No warm-up request finishes, so
    a scenario's new requests add up; every sampling row is still warmed."""
    s = shapes(max_num_seqs=max_num_seqs, decode_sizes=tuple(d for d in DECODE if d <= max_num_seqs))
    scenarios = WarmupPlans(s).scenarios()
    most = max(len({n.req_id for p in sc for n in p.new_requests}) for sc in scenarios)
    assert most == min(max_num_seqs, 64 if max_num_seqs == 64 else 3)
    warmed = {n.sampler_params for sc in scenarios for p in sc for n in p.new_requests}
    assert warmed >= {q for params in warmup_plans.sampling_classes(s).values() for q in params}


@pytest.mark.parametrize("arch,max_num_seqs", [("tiny-llama", 24), ("tiny-qwen3", 24), ("tiny-llama", 1)])
def test_every_plan_runs_through_a_real_runner_without_a_failed_row(model_dirs, arch, max_num_seqs, caplog):
    """All eager on CPU: every plan passes the runner's checks and paths (grammar included)."""
    runner = make_runner(model_dirs[arch], max_num_seqs=max_num_seqs, max_num_batched_tokens=300,
                         num_kv_blocks=40)
    shapes_ = warmup.shapes_of(runner)
    assert shapes_.grammar and shapes_.decode_key is None and shapes_.max_tokens_per_req == 512 - 8  # max_model_len (39 blocks hold more)
    with caplog.at_level(logging.INFO, logger="executor_svc.startup.warmup"):
        warmup.warm_up(runner, on_cpu=True)
    assert "rows failed" not in caplog.text and "warm-up:" in caplog.text
    assert runner.batch.states.count(None) == len(runner.batch.states)  # reset: no row left


def test_with_a_draft_model_verify_rows_carry_counts(model_dirs, caplog):
    path = model_dirs["tiny-llama"]
    runner = make_runner(path, max_num_seqs=8, max_num_batched_tokens=64, num_kv_blocks=40,
                         speculative_model=str(path), num_speculative_tokens=2)
    shapes_ = warmup.shapes_of(runner)
    assert shapes_.draft_model
    verify = [sc[-1] for sc in WarmupPlans(shapes_).verify_scenarios()]
    assert [v.num_draft_tokens for v in verify[:2]] == [[2, 1], [1, 1]]  # an odd and an even count
    assert all(v.draft_token_ids == [] for v in verify)  # counts only: the draft model proposes
    assert [len(v.num_draft_tokens) for v in verify[2:-2]] == representatives(1, 8, request_class)
    greedy_tail, scan = WarmupPlans(shapes_).verify_scenarios()[-2:]  # the greedy tail; no tail (a top-k row)
    assert greedy_tail[-1].num_draft_tokens == [2]
    assert all(new.sampler_params.temperature == 0 for new in greedy_tail[0].new_requests)
    assert [new.sampler_params.top_k for new in scan[0].new_requests] == [0, 5]
    with caplog.at_level(logging.INFO, logger="executor_svc.startup.warmup"):
        warmup.warm_up(runner, on_cpu=True)
    assert "rows failed" not in caplog.text and "warm-up:" in caplog.text
