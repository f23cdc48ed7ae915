"""The public API's codec: streamed responses and the client's sampling fields."""

from protos.llmserve.v1 import llmserve_pb2 as pb
from scheduler_svc.api import codec
from scheduler_svc.core.outputs import RequestOutput
from scheduler_svc.core.request import FinishReason


def test_responses():
    mid = codec.response_to_pb("r", RequestOutput(7, [100], "hi", None, "", 4, 1))
    assert (list(mid.token_ids), mid.text, mid.finish_reason, mid.HasField("usage")) == ([100], "hi", 0, False)
    last = codec.response_to_pb("r", RequestOutput(7, [5], "", FinishReason.STOP, "5", 4, 2))
    assert last.finish_reason == pb.FINISH_REASON_STOP and last.matched_stop == "5"
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (4, 2)


def test_unset_optional_params_stay_unset():
    raw = codec.raw_params_from_pb(pb.SamplingParams(top_k=3))
    assert (raw.max_tokens, raw.temperature, raw.top_p, raw.seed, raw.top_k) == (None, None, None, None, 3)
    raw = codec.raw_params_from_pb(pb.SamplingParams(max_tokens=0, temperature=0.0, seed=0))
    assert (raw.max_tokens, raw.temperature, raw.seed) == (0, 0.0, 0)
