"""The step plan and result across the wire: what the scheduler encodes, the executor decodes
unchanged (columns stay columns), and back."""

from protos.llmserve.executor.v1 import executor_pb2 as epb
from step_protocol import codec
from step_protocol.domain import (CachedRequestData, ExecutorInfo, NewRequestData, SamplerParams,
                                  StepPlan, StepResult)


def test_plan_round_trip_sends_new_requests_in_full_and_cached_rows_as_columns():
    cached = CachedRequestData()
    cached.append(8, 1, [])  # plain decode row
    cached.append(9, 1, [11])  # decode row that crossed into a new block
    cached.append(10, 64, [])  # a later chunk of a long prompt
    cached.append(12, 1, [13, 14])
    plan = StepPlan(
        step_id=42,
        new_requests=[NewRequestData(7, [1, 2, 3, 4], SamplerParams(0.7, 5, 0.9, 2**62 + 3), [5, 6], 0, 3)],
        cached_requests=cached, finished_req_ids=[3], preempted_req_ids=[4])
    msg = codec.plan_to_pb(plan)
    assert list(msg.cached_requests.num_new_blocks) == [0, 1, 0, 2]
    got = codec.plan_from_pb(epb.StepPlan.FromString(msg.SerializeToString()))
    assert got.step_id == 42
    assert got.new_requests == [NewRequestData(
        7, [1, 2, 3, 4], SamplerParams(temperature=0.699999988079071, top_k=5, top_p=0.8999999761581421,
                                       seed=2**62 + 3), [5, 6], 0, 3)]
    assert got.cached_requests == CachedRequestData([8, 9, 10, 12], [1, 1, 64, 1], [0, 1, 0, 2], [11, 13, 14])
    assert (got.finished_req_ids, got.preempted_req_ids) == ([3], [4])
    assert got.scheduled_req_ids == [7, 8, 9, 10, 12] and got.num_scheduled_tokens == 3 + 67


def test_result_and_handshake_round_trip():
    result = StepResult(5, [7, 9], [100, 200], prepare_us=3, forward_us=40, sample_us=2, graph_size=8)
    back = codec.result_from_pb(epb.StepResult.FromString(codec.result_to_pb(result).SerializeToString()))
    assert back == result and back.sampled() == {7: 100, 9: 200}
    failed = codec.result_from_pb(codec.result_to_pb(StepResult(6, error="boom")))
    assert (failed.step_id, failed.error, failed.req_ids) == (6, "boom", [])
    info = ExecutorInfo("m", "/models/m", 512, (2, 3), 2048, 16, 100, (1, 2, 4), 64, 2048, "cpu", "float32")
    assert codec.info_from_pb(epb.ExecutorInfo.FromString(codec.info_to_pb(info).SerializeToString())) == info


def test_empty_and_row_free_plans():
    plan = StepPlan(step_id=1)
    assert plan.is_empty() and not plan.has_rows()
    plan.finished_req_ids.append(3)  # nothing computed, but the executor must drop a row
    assert not plan.is_empty() and not plan.has_rows()
