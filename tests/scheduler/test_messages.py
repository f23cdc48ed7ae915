"""What crosses the pipe between the scheduler's two processes survives it unchanged."""

import pickle

from scheduler_svc.core.outputs import RequestOutput
from scheduler_svc.core.request import FinishReason, SamplingParams
from scheduler_svc.messages import (AbortRequest, AddRequest, Outputs, RequestError, decode_output,
                                    encode_output)


def test_outputs_cross_the_pipe_unchanged():
    for o in [RequestOutput(3, [1, 2], "ab", None, "", 5, 2),
              RequestOutput(3, [9], "", FinishReason.STOP, "</s>", 5, 3),
              RequestOutput(4, [], "", FinishReason.CANCELLED, "", 1, 0)]:
        assert decode_output(encode_output(o)) == o


def test_commands_and_errors_pickle():
    add = AddRequest(1, [5, 6], SamplingParams(max_tokens=3, stop=("x",)))
    assert pickle.loads(pickle.dumps(add)) == add
    assert pickle.loads(pickle.dumps(AbortRequest(1))) == AbortRequest(1)
    msg = pickle.loads(pickle.dumps(Outputs([], [(1, RequestError("INTERNAL", "boom"))], (1, 2))))
    (req_id, err), = msg.errors
    assert (req_id, err.code, err.message, str(err)) == (1, "INTERNAL", "boom", "boom")
