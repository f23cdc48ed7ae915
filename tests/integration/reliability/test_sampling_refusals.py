"""The sampling surface of issue 10 against one real cluster: every bad value of a new field
(n, logprobs, top_logprobs, prompt_logprobs, presence/frequency/repetition penalties, min_p,
logit_bias, min_tokens) gets its exact status code through the real stubs, with a message
naming the field, and after each the server is healthy, serves a normal request token-exact
and holds nothing. The cluster has a small KV cache (63 usable blocks of 16) so that n
samples can outgrow it, and --max-stop-token-ids 400 so that min_tokens can mask more ids
than the executor's table holds.

The values at the edges that are served (the last group) reach the executor's logits
processors: they need the executor side of issue 10 (landed in bf3ad2b)."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks.cluster import generate
from protos.llmserve.v1 import llmserve_pb2 as pb
from tests.integration.conftest import start_cluster

OK = grpc.StatusCode.OK
INVALID = grpc.StatusCode.INVALID_ARGUMENT
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
NORMAL = dict(prompt_ids=[5, 9, 11, 13], max_tokens=6, temperature=0.0, ignore_eos=True)
NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def cluster(model_dirs, tmp_path_factory):
    c = start_cluster(tmp_path_factory, model_dirs["llama"], "sampling-refusals",
                      ["--num-kv-blocks", "64"], ["--max-stop-token-ids", "400"])
    yield c
    c.stop()


@pytest.fixture(scope="module")
def reference(cluster):
    return generate(cluster.stub, **NORMAL)[0]


CASES = [
    # (name, sampling params, code, what the message names)
    ("n 0", dict(n=0), INVALID, "n=0"),
    ("n over --max-n", dict(n=129), INVALID, "1 to 128 parallel samples (--max-n)"),
    ("n samples over the KV cache", dict(n=2, max_tokens=600), EXHAUSTED, "lower max_tokens, n"),
    ("top_logprobs without logprobs", dict(top_logprobs=3), INVALID, "needs logprobs"),
    ("top_logprobs over max_logprobs", dict(logprobs=True, top_logprobs=21), INVALID, "max_logprobs"),
    ("prompt_logprobs over max_logprobs", dict(prompt_logprobs=21), INVALID, "prompt_logprobs=21"),
    ("presence_penalty over 2", dict(presence_penalty=2.5), INVALID, "presence_penalty must be in [-2, 2]"),
    ("presence_penalty nan", dict(presence_penalty=NAN), INVALID, "presence_penalty"),
    ("frequency_penalty under -2", dict(frequency_penalty=-3.0), INVALID, "frequency_penalty must be"),
    ("frequency_penalty inf", dict(frequency_penalty=INF), INVALID, "frequency_penalty"),
    ("repetition_penalty 0", dict(repetition_penalty=0.0), INVALID, "repetition_penalty must be"),
    ("repetition_penalty negative", dict(repetition_penalty=-1.0), INVALID, "repetition_penalty"),
    ("repetition_penalty inf", dict(repetition_penalty=INF), INVALID, "repetition_penalty"),
    ("repetition_penalty nan", dict(repetition_penalty=NAN), INVALID, "repetition_penalty"),
    ("min_p over 1", dict(min_p=1.5), INVALID, "min_p must be in [0, 1]"),
    ("min_p negative", dict(min_p=-0.5), INVALID, "min_p"),
    ("min_p nan", dict(min_p=NAN), INVALID, "min_p"),
    ("logit_bias over max_logit_bias", dict(logit_bias={i: 1.0 for i in range(301)}), INVALID,
     "301 entries; the limit is 300"),
    ("logit_bias id past the vocabulary", dict(logit_bias={512: 1.0}), INVALID, "vocabulary [0, 512)"),
    ("logit_bias negative id", dict(logit_bias={-1: 1.0}), INVALID, "vocabulary"),
    ("logit_bias over 100", dict(logit_bias={5: 100.5}), INVALID, "[-100, 100]"),
    ("logit_bias nan", dict(logit_bias={5: NAN}), INVALID, "[-100, 100]"),
    ("logit_bias -inf", dict(logit_bias={5: -INF}), INVALID, "[-100, 100]"),
    ("min_tokens over max_tokens", dict(min_tokens=5), INVALID, "min_tokens=5 exceeds max_tokens=4"),
    ("min_tokens masking too many ids", dict(min_tokens=1, stop_token_ids=list(range(2, 302))), INVALID,
     "the executor masks at most 288"),
    # at the edges: served (through the executor's processors)
    ("every processor at its edge", dict(
        presence_penalty=2.0, frequency_penalty=-2.0, repetition_penalty=1e-3, min_p=1.0,
        logit_bias={i: (100.0 if i % 2 else -100.0) for i in range(300)}, min_tokens=4,
        stop_token_ids=list(range(2, 282)), temperature=1.0, n=3, logprobs=True, top_logprobs=20,
        prompt_logprobs=20), OK, ""),
    ("n samples filling the KV cache", dict(n=63, max_tokens=1), OK, ""),  # a block each
    ("n samples one block over", dict(n=64, max_tokens=1), EXHAUSTED, "64 KV blocks"),
]


def _call(cluster, params) -> tuple[grpc.StatusCode, str]:
    params = {"max_tokens": 4, **params}
    req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5, 6, 7]), params=pb.SamplingParams(**params))
    try:
        messages = list(cluster.stub.Generate(req, timeout=60))
        assert sum(1 for m in messages if m.finish_reason) == params.get("n", 1)
        return OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details() or ""


@pytest.mark.parametrize("name,params,code,needle", CASES, ids=[c[0] for c in CASES])
def test_sampling_field_gets_its_status_and_harms_nothing(cluster, reference, name, params, code, needle):
    got, details = _call(cluster, params)
    assert got == code, details
    assert needle in details
    health = health_pb2_grpc.HealthStub(cluster.channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == \
        health_pb2.HealthCheckResponse.SERVING
    assert generate(cluster.stub, **NORMAL)[0] == reference
    s = cluster.wait_idle()
    assert (s.num_running, s.num_waiting, s.free_blocks) == (0, 0, s.total_blocks)


def test_complete_refuses_alike(cluster):
    req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5, 6]), params=pb.SamplingParams(
        max_tokens=4, min_p=2.0))
    with pytest.raises(grpc.RpcError) as err:
        cluster.stub.Complete(req, timeout=30)
    assert err.value.code() == INVALID and "min_p" in err.value.details()
