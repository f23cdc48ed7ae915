"""The step plan across the wire: the scheduler's encoding, parsed by the executor's decoding."""

from executor_svc import wire as executor_wire
from executor_svc.plan import CachedRequest, NewRequest
from executor_svc.plan import SamplingParams as ExecutorSampling
from protos.llmserve.executor.v1 import executor_pb2 as epb
from protos.llmserve.v1 import llmserve_pb2 as pb
from scheduler_svc import wire
from scheduler_svc.request import FinishReason, SamplingParams
from scheduler_svc.scheduler_output import CachedRequestData, NewRequestData, RequestOutput, SchedulerOutput


def _over_the_wire(out: SchedulerOutput):
    data = wire.plan_to_pb(out).SerializeToString()
    return executor_wire.plan_from_pb(epb.StepPlan.FromString(data))


def test_plan_round_trip_sends_new_requests_in_full_and_decode_rows_packed():
    params = SamplingParams(max_tokens=9, temperature=0.7, top_k=5, top_p=0.9, seed=2**62 + 3)
    out = SchedulerOutput(
        step_id=42,
        new_requests=[NewRequestData(7, [1, 2, 3, 4], params, [5, 6], 0, 3)],
        cached_requests=[
            CachedRequestData(8, [], 1),        # plain decode row
            CachedRequestData(9, [11], 1),      # decode row that crossed into a new block
            CachedRequestData(10, [], 64),      # a later chunk of a long prompt
            CachedRequestData(12, [], 1),
        ],
        finished_req_ids=[3], preempted_req_ids=[4])
    plan = _over_the_wire(out)
    assert plan.step_id == 42
    assert plan.new_requests == [NewRequest(
        7, [1, 2, 3, 4], ExecutorSampling(temperature=0.699999988079071, top_k=5, top_p=0.8999999761581421,
                                          seed=2**62 + 3), [5, 6], 0, 3)]
    assert plan.cached_requests == [CachedRequest(9, [11], 1), CachedRequest(10, [], 64)]
    assert plan.decode_req_ids == [8, 12]
    assert (plan.finished_req_ids, plan.preempted_req_ids) == ([3], [4])


def test_results_and_responses():
    result = epb.StepResult(step_id=1, req_ids=[7, 9], token_ids=[100, 200])
    assert wire.sampled_from_pb(epb.StepResult.FromString(result.SerializeToString())) == {7: 100, 9: 200}
    mid = wire.response_to_pb("r", RequestOutput(7, [100], "hi", None, "", 4, 1))
    assert (list(mid.token_ids), mid.text, mid.finish_reason, mid.HasField("usage")) == ([100], "hi", 0, False)
    last = wire.response_to_pb("r", RequestOutput(7, [5], "", FinishReason.STOP, "5", 4, 2))
    assert last.finish_reason == pb.FINISH_REASON_STOP and last.matched_stop == "5"
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (4, 2)


def test_unset_optional_params_stay_unset():
    raw = wire.raw_params_from_pb(pb.SamplingParams(top_k=3))
    assert (raw.max_tokens, raw.temperature, raw.top_p, raw.seed, raw.top_k) == (None, None, None, None, 3)
    raw = wire.raw_params_from_pb(pb.SamplingParams(max_tokens=0, temperature=0.0, seed=0))
    assert (raw.max_tokens, raw.temperature, raw.seed) == (0, 0.0, 0)


def test_outputs_cross_the_engine_core_pipe_unchanged():
    from scheduler_svc.engine_core import decode_output, encode_output

    for o in [RequestOutput(3, [1, 2], "ab", None, "", 5, 2),
              RequestOutput(3, [9], "", FinishReason.STOP, "</s>", 5, 3),
              RequestOutput(4, [], "", FinishReason.CANCELLED, "", 1, 0)]:
        assert decode_output(encode_output(o)) == o
