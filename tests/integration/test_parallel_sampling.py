"""Parallel sampling (n) through both services as processes: one stream with each sample's
index, seeded samples reproducible (sample i is the n = 1 request seeded seed + i), samples
1..n-1 reusing sample 0's prompt blocks (exact hits in GetServerStatus), usage, Complete's
choices, and a cancelled call that frees every sample. None of this needs the executor's
logits processors: it runs on the executor's sampler alone."""

import grpc
import pytest

from benchmarks.cluster import generate
from protos.llmserve.v1 import llmserve_pb2 as pb

PROMPT = [(7 * i) % 400 + 3 for i in range(40)]  # 2 full blocks of 16 before its last token
SAMPLED = dict(max_tokens=8, temperature=1.0, seed=1234, ignore_eos=True)


@pytest.fixture(scope="module")
def cluster(llama_cluster):
    return llama_cluster  # the package's: every flag at its default (tests/integration/conftest.py)


def _request(prompt=PROMPT, **params) -> pb.GenerateRequest:
    return pb.GenerateRequest(token_ids=pb.TokenIds(ids=prompt), params=pb.SamplingParams(**params))


def _by_index(messages, n):
    tokens, texts, last = [[] for _ in range(n)], [""] * n, [None] * n
    for m in messages:
        assert last[m.index] is None, "a message after the sample's last"
        tokens[m.index] += m.token_ids
        texts[m.index] += m.text
        if m.finish_reason:
            last[m.index] = m
    assert all(last), "a sample did not finish"
    return tokens, texts, last


def test_n_samples_stream_with_their_index_and_repeat_with_the_seed(cluster):
    stub = cluster.stub
    messages = list(stub.Generate(_request(n=4, **SAMPLED), timeout=120))
    tokens, texts, last = _by_index(messages, 4)
    assert all(len(t) == 8 for t in tokens) and len({tuple(t) for t in tokens}) == 4
    assert [(m.usage.prompt_tokens, m.usage.completion_tokens) for m in last] == [(40, 8)] * 4
    assert [m.HasField("total_usage") for m in messages] == [False] * (len(messages) - 1) + [True]
    total = messages[-1].total_usage
    assert (total.prompt_tokens, total.completion_tokens) == (40, 32)  # the prompt counted once
    again = _by_index(stub.Generate(_request(n=4, **SAMPLED), timeout=120), 4)[0]
    assert again == tokens
    # sample i is what a single request seeded seed + i samples
    for i in (0, 3):
        single, _, _ = generate(stub, prompt_ids=PROMPT, **{**SAMPLED, "seed": 1234 + i})
        assert single == tokens[i]
    # Complete: every sample whole, in index order
    full = stub.Complete(_request(n=4, **SAMPLED), timeout=120)
    assert [c.index for c in full.choices] == [0, 1, 2, 3]
    assert [list(c.token_ids) for c in full.choices] == tokens
    assert [c.text for c in full.choices] == texts
    assert (full.usage.prompt_tokens, full.usage.completion_tokens) == (40, 32)
    assert all(c.finish_reason == pb.FINISH_REASON_LENGTH for c in full.choices)
    cluster.wait_idle()


def test_samples_reuse_the_prompt_blocks_of_sample_0(cluster):
    prompt = [(11 * i) % 500 + 2 for i in range(40)]  # not seen before: a cold cache
    before = cluster.wait_idle()
    list(cluster.stub.Generate(_request(prompt, n=5, **SAMPLED), timeout=120))
    after = cluster.wait_idle()
    assert after.prefix_cache_queries - before.prefix_cache_queries == 5 * 40
    assert after.prefix_cache_hits - before.prefix_cache_hits == 4 * 32  # 2 blocks each of 1..4
    assert after.free_blocks == after.total_blocks


def test_greedy_samples_are_equal_and_n_1_is_unchanged(cluster):
    tokens = _by_index(cluster.stub.Generate(_request(n=3, max_tokens=6, temperature=0.0), timeout=120), 3)[0]
    single, _, last = generate(cluster.stub, prompt_ids=PROMPT, max_tokens=6, temperature=0.0)
    assert tokens == [single] * 3
    assert last.index == 0 and last.total_usage.completion_tokens == len(single)


def test_cancelling_the_call_aborts_every_sample(cluster):
    call = cluster.stub.Generate(_request(n=6, max_tokens=1500, temperature=1.0, ignore_eos=True),
                                 timeout=120)
    seen = set()
    for m in call:
        seen.add(m.index)
        if len(seen) == 6:
            break
    call.cancel()
    s = cluster.wait_idle(timeout=30)
    assert (s.num_running, s.num_waiting, s.free_blocks) == (0, 0, s.total_blocks)


def test_n_at_max_n_is_served(cluster):
    messages = list(cluster.stub.Generate(_request(n=128, max_tokens=2, temperature=1.0), timeout=120))
    tokens, _, _ = _by_index(messages, 128)
    assert all(len(t) <= 2 for t in tokens) and messages[-1].total_usage.prompt_tokens == 40
    cluster.wait_idle()


@pytest.mark.parametrize("n,needle", [(0, "n=0"), (129, "--max-n")])
def test_n_outside_1_to_max_n_is_invalid_argument(cluster, n, needle):
    with pytest.raises(grpc.RpcError) as err:
        list(cluster.stub.Generate(_request(n=n, max_tokens=4), timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and needle in err.value.details()
    assert cluster.stub.GetModelInfo(pb.GetModelInfoRequest()).max_n == 128
