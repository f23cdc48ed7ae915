"""What crosses the pipe between the scheduler's two processes survives it unchanged."""

import pickle

from scheduler_svc.core.outputs import LogprobColumns, RequestOutput
from scheduler_svc.core.request import FinishReason, SamplingParams
from scheduler_svc.messages import (AbortRequest, AddRequest, Outputs, RequestError, decode_output,
                                    encode_output)


def test_outputs_cross_the_pipe_unchanged():
    for o in [RequestOutput(3, [1, 2], "ab", None, "", 5, 2),
              RequestOutput(3, [9], "", FinishReason.STOP, "</s>", 5, 3),
              RequestOutput(4, [], "", FinishReason.CANCELLED, "", 1, 0),
              RequestOutput(5, [6, 7], "xy", None, "", 2, 2,
                            [(6, -0.5, 1, [6, 3], [-0.5, -1.5]), (7, -0.25, 1, [], [])],
                            LogprobColumns.starting_with(1, 2))]:
        assert decode_output(encode_output(o)) == o


def test_commands_and_errors_pickle():
    add = AddRequest(1, [5, 6], SamplingParams(max_tokens=3, stop=("x",), n=4, logprobs=2,
                                                logit_bias=((5, 1.5),), min_tokens=1))
    assert pickle.loads(pickle.dumps(add)) == add
    assert pickle.loads(pickle.dumps(AbortRequest(1))) == AbortRequest(1)
    msg = pickle.loads(pickle.dumps(Outputs([], [(1, RequestError("INTERNAL", "boom"))], (1, 2))))
    (req_id, err), = msg.errors
    assert (req_id, err.code, err.message, str(err)) == (1, "INTERNAL", "boom", "boom")


def test_stats_tuple_round_trips_every_field():
    from dataclasses import astuple, fields

    from scheduler_svc.messages import CoreStats, stats_tuple

    s = CoreStats(**{f.name: (7, 8) if f.name == "step_time_counts" else i + 1 for i, f in enumerate(fields(CoreStats))})
    assert stats_tuple(s) == astuple(s)
    assert CoreStats(*stats_tuple(s)) == s
