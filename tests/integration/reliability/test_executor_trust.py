"""The executor trusts only its scheduler (both real services, one cluster): a local process
without the internal token cannot reset the executor, open a plan stream or send a plan —
each call fails UNAUTHENTICATED — and a greedy stream in flight meanwhile is token-exact with
an undisturbed run."""

from __future__ import annotations

import grpc
import pytest

from benchmarks.cluster import generate
from protos.llmserve.executor.v1 import executor_pb2 as epb
from protos.llmserve.executor.v1 import executor_pb2_grpc as epb_grpc
from protos.llmserve.v1 import llmserve_pb2 as pb

PROMPT = [5, 17, 42, 99, 123, 7, 8, 250]
MAX_TOKENS = 256  # long enough that the attacks below land while the victim still decodes


@pytest.fixture(scope="module")
def cluster(llama_cluster):
    return llama_cluster  # the package's: every flag at its default (tests/integration/conftest.py)


def _hostile_plan(step_id: int) -> epb.StepPlan:
    """What an impersonator would send: a request writing over the first KV blocks (where the
    victim's prompt lives), and a 'finish' of the victim's likely id."""
    return epb.StepPlan(step_id=step_id, finished_req_ids=[0, 1, 2], new_requests=[epb.NewRequest(
        req_id=10_000, token_ids=list(range(3, 67)), block_ids=[1, 2, 3, 4], num_scheduled_tokens=64,
        sampler_params=epb.SamplerParams(temperature=0.0, top_p=1.0))])


def _attack(address: str, metadata) -> list[grpc.StatusCode]:
    """Reset, a plan on a new Execute stream, and a handshake; the status code of each."""
    codes = []
    with grpc.insecure_channel(address) as channel:
        stub = epb_grpc.ExecutorStub(channel)
        calls = [lambda: stub.Reset(epb.ResetRequest(), metadata=metadata, timeout=10),
                 lambda: list(stub.Execute(iter([_hostile_plan(1), _hostile_plan(2)]), metadata=metadata, timeout=10)),
                 lambda: stub.Handshake(epb.HandshakeRequest(), metadata=metadata, timeout=10)]
        for call in calls:
            try:
                call()
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as e:
                codes.append(e.code())
    return codes


def test_impersonator_is_refused_and_the_stream_in_flight_is_undisturbed(cluster):
    params = dict(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    reference, _, _ = generate(cluster.stub, prompt_ids=PROMPT, **params)
    assert len(reference) == MAX_TOKENS

    req = pb.GenerateRequest(params=pb.SamplingParams(**params))
    req.token_ids.ids.extend(PROMPT)
    victim = cluster.stub.Generate(req, timeout=120)
    got = list(next(victim).token_ids)  # the victim is decoding now
    for metadata in (None, (("authorization", "Bearer not-the-token"),),
                     (("authorization", f"Bearer {cluster.internal_token}x"),)):
        assert _attack(cluster.executor_address, metadata) == [grpc.StatusCode.UNAUTHENTICATED] * 3
    assert cluster.status().num_running == 1, "the victim finished before the attacks ended"
    for msg in victim:
        got += msg.token_ids
        last = msg
    assert got == reference  # token-exact: no reset, no overwritten KV, no foreign finish
    assert last.finish_reason == pb.FINISH_REASON_LENGTH
