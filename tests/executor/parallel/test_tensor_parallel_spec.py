"""Speculative decoding on 2 gloo ranks (CPU, float32): the scheduler core with the n-gram
proposer drives the rank-0 runner through the step loop (3 steps in flight, as
tests/integration/test_spec_decode.py does with one rank). Rank 0 decides acceptance and
broadcasts the rows' last tokens; the rejected drafts' slots go to every rank with the next
plan. Greedy with and without speculation and seeded sampling with speculation give the
tokens of one rank, with accepted and rejected drafts and chained verify rows."""

from __future__ import annotations

from executor_svc.config import ExecutorConfig
from tests.executor.tp_helpers import run_ranks, single


def _scenario(tp, path):
    from executor_svc.parallel.ranks import serve_plans
    from executor_svc.startup.build import build_runner
    from tests.integration.test_spec_decode import SPEC, generate, prompts_for

    runner = build_runner(ExecutorConfig(model=str(path), device="cpu", dtype="float32", max_num_seqs=8,
                                         max_num_batched_tokens=64, num_kv_blocks=96, max_model_len=256,
                                         block_size=16), tp)
    if tp.rank != 0:
        return serve_plans(runner)
    prompts = prompts_for(runner.info().vocab_size)
    out = {"off": generate(runner, prompts, None, depth=3)[0]}
    plans = []
    out["on"], scheduler = generate(runner, prompts, SPEC, depth=3, plans=plans)
    stats = scheduler.spec.stats
    out["greedy_stats"] = (stats.num_draft_tokens, stats.num_accepted_tokens)
    out["chained"] = sum(sum(p.draft_chained) for p in plans)  # rows launched before the last finished
    out["sampled"], scheduler = generate(runner, prompts, SPEC, depth=3, temperature=0.3, top_k=5)
    stats = scheduler.spec.stats
    out["sampled_stats"] = (stats.num_draft_tokens, stats.num_accepted_tokens)
    if tp.size > 1:
        runner.close()
    return out


def test_speculation_on_two_ranks_gives_the_tokens_of_one(model_dirs):
    path = model_dirs["tiny-llama"]
    ref = single(_scenario, path)
    got, _ = run_ranks(2, _scenario, path, timeout=300)
    assert got["off"] == ref["off"] and got["on"] == ref["off"]  # token-exact, speculation on or off
    assert got["on"] == ref["on"] and got["greedy_stats"] == ref["greedy_stats"]
    drafted, accepted = got["greedy_stats"]
    assert 0 < accepted < drafted, got["greedy_stats"]  # some drafts accepted, some rejected
    assert got["chained"] == ref["chained"] > 0  # chained verify rows, void ones rolled back on every rank
    assert got["sampled"] == ref["sampled"] and got["sampled_stats"] == ref["sampled_stats"]
    drafted, accepted = got["sampled_stats"]
    assert 0 < accepted < drafted, got["sampled_stats"]  # rank 0 decided, every rank rolled back
    assert all(len(t) == 48 for t in got["sampled"].values())
