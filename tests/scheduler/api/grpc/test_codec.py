"""The public API's codec: streamed responses and the client's sampling fields."""

from protos.llmserve.v1 import llmserve_pb2 as pb
from scheduler_svc.api.grpc import codec
from scheduler_svc.core.outputs import LogprobColumns, RequestOutput
from scheduler_svc.core.request import FinishReason
from step_protocol.domain import Logprobs


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


def prompt_columns() -> LogprobColumns:
    """Prompt [1, 2]: position 1 with one alternative, cut from the executor's two."""
    c = LogprobColumns.starting_with(1, 1)
    c.extend_from(Logprobs(2, [9, 2], [-9.0, -3.0], [9, 7], [1, 1, 4, 5], [-1.0, -1.0, -0.5, -0.75]), 1, 1)
    return c


def test_logprobs_index_and_the_prompt_s_first_token_without_logprob():
    out = RequestOutput(7, [5, 6], "ab", None, "", 3, 2,
                        logprobs=[(5, -0.5, 2, [9, 5], [-0.25, -0.5]), (6, -1.0, 1, [6, 9], [-1.0, -2.0])],
                        prompt_logprobs=prompt_columns(), index=2)
    msg = codec.response_to_pb("r", out)
    assert msg.index == 2 and [e.token_id for e in msg.logprobs] == list(msg.token_ids)
    first = msg.logprobs[0]
    assert (first.logprob, first.rank, [(t.token_id, t.logprob) for t in first.top_logprobs]) == (
        -0.5, 2, [(9, -0.25), (5, -0.5)])
    p0, p1 = msg.prompt_logprobs
    assert (p0.token_id, p0.HasField("logprob"), p0.rank, len(p0.top_logprobs)) == (1, False, 0, 0)
    assert (p1.token_id, p1.HasField("logprob"), p1.logprob, p1.rank) == (2, True, -3.0, 7)
    assert [(t.token_id, t.logprob) for t in p1.top_logprobs] == [(4, -0.5)]
    assert codec.num_logprob_messages(out) == 2 * 3 + 2 * 2
    plain = codec.response_to_pb("r", RequestOutput(7, [5], "a", None, "", 3, 1))
    assert (plain.index, len(plain.logprobs), len(plain.prompt_logprobs)) == (0, 0, 0)


def test_sampling_surface_fields_keep_presence():
    raw = codec.raw_params_from_pb(pb.SamplingParams())
    assert (raw.n, raw.prompt_logprobs, raw.repetition_penalty, raw.logprobs, raw.top_logprobs,
            raw.min_tokens, dict(raw.logit_bias)) == (None, None, None, False, 0, 0, {})
    raw = codec.raw_params_from_pb(pb.SamplingParams(
        n=0, prompt_logprobs=0, repetition_penalty=0.0, logprobs=True, top_logprobs=3, min_p=0.5,
        presence_penalty=1.5, frequency_penalty=-1.5, logit_bias={5: -1.0}, min_tokens=4))
    assert (raw.n, raw.prompt_logprobs, raw.repetition_penalty, raw.logprobs, raw.top_logprobs,
            raw.min_p, raw.presence_penalty, raw.frequency_penalty, dict(raw.logit_bias),
            raw.min_tokens) == (0, 0, 0.0, True, 3, 0.5, 1.5, -1.5, {5: -1.0}, 4)
