"""--deterministic through both services (issue 28): the same request gives the same tokens and
logprobs, bit for bit, alone and inside batches of random others, from the prefix cache, with
chunked prefill, after preemption and with n-gram speculation; greedy and seeded sampling at
temperature 1. CPU float32 with the tiny llama (the executor's invariant path: per-row GEMMs,
per-token attention); tests/integration/test_cuda_deterministic.py runs the same checks in bf16
on the GPU with the built-in model.

Three clusters: `plain` (one step holds the whole prompt, prefix caching on), `squeezed` (steps
of 24 tokens, so prompts are chunked; 13 usable KV blocks, so requests are preempted) and
`spec` (n-gram speculation). All must give the reference: the request alone on `plain`."""

from __future__ import annotations

import pytest

from benchmarks.cluster import free_port
from benchmarks.determinism import KINDS, answer, counters, with_others
from tests.integration.conftest import start_cluster

MAX_TOKENS = 24
TARGET = list(range(100, 130)) + [5, 17, 42, 9, 33, 21] * 6  # 66 tokens (its tail repeats: n-gram drafts)
SPEC = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'


def _cluster(tmp_path_factory, model_dirs, name, executor_args=(), scheduler_args=()):
    port = free_port()
    cluster = start_cluster(tmp_path_factory, model_dirs["llama"], name, executor_args=["--deterministic", *executor_args],
                            scheduler_args=["--metrics-port", str(port), *scheduler_args])
    cluster.metrics_port = port
    return cluster


@pytest.fixture(scope="module")
def plain(model_dirs, tmp_path_factory):
    cluster = _cluster(tmp_path_factory, model_dirs, "deterministic")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def reference(plain):
    """The target alone, on a cold cache, each kind."""
    return {kind: answer(plain.stub, TARGET, kind, MAX_TOKENS) for kind in KINDS}


@pytest.mark.parametrize("kind", list(KINDS))
def test_alone_in_batches_and_from_the_prefix_cache(plain, reference, kind):
    expected = reference[kind]
    assert len(expected[0]) == MAX_TOKENS and len(expected[1]) == MAX_TOKENS
    hits = plain.status().prefix_cache_hits
    assert answer(plain.stub, TARGET, kind, MAX_TOKENS) == expected  # its prompt's blocks are cached now
    assert plain.status().prefix_cache_hits > hits
    for num_others, seed in ((1, 1), (7, 2), (31, 3)):
        assert with_others(plain.stub, TARGET, num_others, kind, seed, MAX_TOKENS) == expected, \
            f"beside {num_others} others"
    assert plain.wait_idle().free_blocks == plain.status().total_blocks


def test_chunked_prefill_and_preemption_on_a_small_cache(model_dirs, tmp_path_factory, reference):
    cluster = _cluster(tmp_path_factory, model_dirs, "deterministic-squeezed",
                       ["--max-num-batched-tokens", "24", "--num-kv-blocks", "14"])
    try:
        for kind in KINDS:
            assert answer(cluster.stub, TARGET, kind, MAX_TOKENS) == reference[kind], f"{kind}, alone"
            for seed in (4, 5):
                got = with_others(cluster.stub, TARGET, 7, kind, seed, MAX_TOKENS, last=True)
                assert got == reference[kind], f"{kind}, beside 7 others (seed {seed})"
        assert counters(cluster.metrics_port)["llmserve:num_preemptions_total"] > 0
        assert cluster.wait_idle().free_blocks == cluster.status().total_blocks
    finally:
        cluster.stop()


def test_speculation_on_gives_the_tokens_of_speculation_off(model_dirs, tmp_path_factory, reference):
    """Drafts are verified with the logits a decode step would compute, and (seeded) accepted
    iff the sampler's own draw at that position equals the draft: the tokens of speculation
    off. (A request asking for logprobs does not speculate: these ask for none.)"""
    cluster = _cluster(tmp_path_factory, model_dirs, "deterministic-spec", scheduler_args=["--speculative-config", SPEC])
    try:
        for kind in KINDS:
            expected = reference[kind][0]
            assert answer(cluster.stub, TARGET, kind, MAX_TOKENS, logprobs=False)[0] == expected, f"{kind}, alone"
            got = with_others(cluster.stub, TARGET, 7, kind, 6, MAX_TOKENS, logprobs=False)[0]
            assert got == expected, f"{kind}, beside 7 others"
        assert counters(cluster.metrics_port)["llmserve:spec_decode_num_drafts_total"] > 0
    finally:
        cluster.stop()
