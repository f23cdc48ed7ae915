"""Logprobs and logits processors through both services as processes.

NEEDS THE EXECUTOR SIDE OF ISSUE 10 (logits processors and logprobs on the device, landed in
bf3ad2b): the executor fills StepResult.logprobs / prompt_logprobs and applies logit_bias and
the min_tokens mask. These tests check what the scheduler makes of it: logprobs aligned with
token_ids in every message, top-N per request, prompt logprobs once per request (in sample
0's first message, the first token without a logprob, the prompt computed in full even when
cached), min_tokens holding off a stop token, logit_bias steering greedy decoding. Parity of
the values with transformers is the executor's tests' job."""

import pytest

from protos.llmserve.v1 import llmserve_pb2 as pb

PROMPT = [(13 * i) % 450 + 4 for i in range(37)]


@pytest.fixture(scope="module")
def cluster(llama_cluster):
    return llama_cluster  # the package's: every flag at its default (tests/integration/conftest.py)


def _stream(cluster, prompt=PROMPT, **params):
    req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=prompt), params=pb.SamplingParams(**params))
    return list(cluster.stub.Generate(req, timeout=120))


def _tokens(messages, index=0):
    return [t for m in messages if m.index == index for t in m.token_ids]


def test_logprobs_travel_with_their_tokens(cluster):
    messages = _stream(cluster, max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=True, top_logprobs=4)
    for m in messages:
        assert [e.token_id for e in m.logprobs] == list(m.token_ids)
        for e in m.logprobs:
            tops = [t.logprob for t in e.top_logprobs]
            assert len(tops) == 4 and tops == sorted(tops, reverse=True)
            # greedy: the sampled token is the most likely one
            assert e.rank == 1 and e.top_logprobs[0].token_id == e.token_id
            assert e.logprob == pytest.approx(tops[0]) and e.logprob <= 0
        assert not m.prompt_logprobs
    only = _stream(cluster, max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=True)
    assert all(len(e.top_logprobs) == 0 and e.HasField("logprob") for m in only for e in m.logprobs)
    assert _tokens(only) == _tokens(messages)[:4]
    plain = _stream(cluster, max_tokens=4, temperature=0.0, ignore_eos=True)
    assert not any(m.logprobs for m in plain) and _tokens(plain) == _tokens(only)


def test_each_request_gets_its_own_top_n_in_a_shared_step(cluster):
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(3) as pool:
        runs = list(pool.map(lambda k: _stream(cluster, max_tokens=12, temperature=1.0, seed=k,
                                               ignore_eos=True, logprobs=True, top_logprobs=k),
                             [1, 7, 20]))
    for k, messages in zip([1, 7, 20], runs):
        entries = [e for m in messages for e in m.logprobs]
        assert len(entries) == 12 and all(len(e.top_logprobs) == k for e in entries)
        assert all(e.rank >= 1 for e in entries)


def test_prompt_logprobs_once_in_sample_0_s_first_message_and_never_from_the_cache(cluster):
    before = cluster.wait_idle()
    runs = [_stream(cluster, max_tokens=3, temperature=0.0, ignore_eos=True, n=2, prompt_logprobs=2)
            for _ in range(2)]  # the second finds the whole prompt cached, and computes it anyway
    after = cluster.wait_idle()
    for messages in runs:
        with_prompt = [m for m in messages if m.prompt_logprobs]
        assert len(with_prompt) == 1 and with_prompt[0] is next(m for m in messages if m.index == 0)
        entries = with_prompt[0].prompt_logprobs
        assert [e.token_id for e in entries] == PROMPT
        assert not entries[0].HasField("logprob") and entries[0].rank == 0
        assert all(e.HasField("logprob") and e.rank >= 1 and len(e.top_logprobs) == 2 for e in entries[1:])
    first, second = (r[0].prompt_logprobs for r in runs)
    assert [e.logprob for e in first[1:]] == pytest.approx([e.logprob for e in second[1:]], abs=1e-4)
    # sample 0 looks nothing up (it needs the prompt's logits); sample 1 hits 2 blocks each time
    assert after.prefix_cache_queries - before.prefix_cache_queries == 2 * 37
    assert after.prefix_cache_hits - before.prefix_cache_hits == 2 * 32


def test_complete_carries_logprobs_per_choice(cluster):
    req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=PROMPT), params=pb.SamplingParams(
        max_tokens=5, temperature=1.0, seed=9, ignore_eos=True, n=2, logprobs=True, top_logprobs=1,
        prompt_logprobs=0))
    full = cluster.stub.Complete(req, timeout=120)
    for c in full.choices:
        assert [e.token_id for e in c.logprobs] == list(c.token_ids)
    assert len(full.choices[0].prompt_logprobs) == len(PROMPT) and not full.choices[1].prompt_logprobs
    streamed = _stream(cluster, **{f.name: v for f, v in req.params.ListFields()})
    assert [list(c.token_ids) for c in full.choices] == [_tokens(streamed, 0), _tokens(streamed, 1)]


def test_min_tokens_holds_off_a_stop_token(cluster):
    greedy = _tokens(_stream(cluster, max_tokens=12, temperature=0.0, ignore_eos=True))
    stop = greedy[1]
    early = _stream(cluster, max_tokens=12, temperature=0.0, ignore_eos=True, stop_token_ids=[stop])
    assert len(_tokens(early)) <= 2 and early[-1].finish_reason == pb.FINISH_REASON_STOP
    held = _tokens(_stream(cluster, max_tokens=12, temperature=0.0, ignore_eos=True,
                           stop_token_ids=[stop], min_tokens=6))
    assert len(held) >= 6 and stop not in held[:6]


def test_logit_bias_steers_greedy_decoding(cluster):
    tokens = _tokens(_stream(cluster, max_tokens=6, temperature=0.0, ignore_eos=True, logit_bias={77: 100.0}))
    assert tokens == [77] * 6


def test_a_long_prompt_s_logprobs_are_all_there(cluster):
    # 1,500 positions with 5 alternatives: the message is built off the event loop
    prompt = [(17 * i) % 500 + 3 for i in range(1500)]
    messages = _stream(cluster, prompt, max_tokens=2, temperature=0.0, prompt_logprobs=5, logprobs=True)
    entries = messages[0].prompt_logprobs
    assert [e.token_id for e in entries] == prompt and not entries[0].HasField("logprob")
    assert all(len(e.top_logprobs) == 5 and e.rank >= 1 for e in entries[1:])
    assert sum(1 for m in messages if m.prompt_logprobs) == 1
