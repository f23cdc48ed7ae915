"""The speculative-decoding columns of the step protocol survive the wire, and are absent
without drafts."""

from protos.llmserve.executor.v1 import executor_pb2 as pb
from step_protocol import codec
from step_protocol.domain import CachedRequestData, StepPlan, StepResult


def test_draft_columns_round_trip():
    plan = StepPlan(3, cached_requests=CachedRequestData())
    plan.cached_requests.append(7, 1, [])
    plan.cached_requests.append(8, 3, [4])
    plan.add_drafts([11, 12])
    plan.cached_requests.append(9, 1, [])
    assert plan.num_draft_tokens == [0, 2]  # rows past the end have none
    wire = pb.StepPlan.FromString(codec.plan_to_pb(plan).SerializeToString())
    assert codec.plan_from_pb(wire) == plan
    plain = StepPlan(4, cached_requests=CachedRequestData.decode_rows([1, 2]))
    assert not codec.plan_to_pb(plain).num_draft_tokens
    assert codec.plan_from_pb(codec.plan_to_pb(plain)) == plain


def test_result_token_lists_round_trip():
    result = StepResult(3, req_ids=[7, 8], token_ids=[5, 11, 12, 6], num_tokens=[1, 3])
    back = codec.result_from_pb(pb.StepResult.FromString(codec.result_to_pb(result).SerializeToString()))
    assert back == result and back.sampled() == {7: [5], 8: [11, 12, 6]}
    assert StepResult(1, req_ids=[7], token_ids=[5]).sampled() == {7: 5}


def test_draft_slots_send_their_count_only_and_the_handshake_names_the_draft():
    from step_protocol.domain import DraftSlots, ExecutorInfo

    plan = StepPlan(5, cached_requests=CachedRequestData())
    plan.cached_requests.append(7, 4, [])
    plan.add_drafts(DraftSlots(3))
    assert (plan.num_draft_tokens, plan.draft_token_ids) == ([3], [])
    assert codec.plan_from_pb(codec.plan_to_pb(plan)) == plan
    info = ExecutorInfo("m", "/m", 512, (2,), 256, 16, 96, (), 8, 64, "cpu", "float32",
                        draft_model_path="/models/draft")
    assert codec.info_from_pb(codec.info_to_pb(info)) == info
    assert codec.info_from_pb(codec.info_to_pb(ExecutorInfo(**{**info.__dict__, "draft_model_path": ""}))
                              ).draft_model_path == ""
