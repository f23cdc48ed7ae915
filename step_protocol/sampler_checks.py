"""What a request's SamplerParams may hold: one definition for both services.

The executor refuses a new request whose parameters fail `check_sampler` (worker/plan_checks.py);
the scheduler's validation runs the same function on the values it is about to send, rounded
as the wire rounds them (`float32`), so a request that passes validation can never be refused
by the executor, nor fail to encode (integer widths come from the message's own descriptor).
"""

from __future__ import annotations

import math
import struct

from google.protobuf.descriptor import FieldDescriptor

from protos.llmserve.executor.v1 import executor_pb2 as pb
from llmserve.limits import MAX_GRAMMAR_BYTES
from step_protocol.domain import ExecutorInfo, SamplerParams

_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_UINT32: (0, (1 << 32) - 1),
    FieldDescriptor.TYPE_INT64: (-(1 << 63), (1 << 63) - 1),
    FieldDescriptor.TYPE_UINT64: (0, (1 << 64) - 1),
}


class SamplerParamsError(ValueError):
    """A SamplerParams field outside what the plan can carry or the sampler implements."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field} {message}")
        self.field = field


def int_range(message: type, field: str) -> tuple[int, int]:
    """The integers a protobuf field of `message` can hold (from its descriptor)."""
    return _INT_RANGES[message.DESCRIPTOR.fields_by_name[field].type]


def float32(x: float) -> float:
    """x as a 32-bit float holds it (the wire's `float`): values past the largest float32
    become ±inf, tiny ones 0 (or a denormal), NaN stays NaN."""
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:  # struct refuses what rounds past FLOAT32_MAX; the wire has inf
        return math.copysign(math.inf, x)


def check_sampler(p: SamplerParams, info: ExecutorInfo) -> None:
    """Raises SamplerParamsError naming the first field the executor cannot run."""
    def need(ok: bool, field: str, what: str) -> None:
        if not ok:
            raise SamplerParamsError(field, f"{getattr(p, field)!r}: {what}")

    for field in ("top_k", "seed", "min_tokens", "logprobs", "prompt_logprobs"):
        lo, hi = int_range(pb.SamplerParams, field)
        need(lo <= getattr(p, field) <= hi, field, f"need {lo} to {hi} (its wire type)")
    need(math.isfinite(p.temperature) and p.temperature >= 0, "temperature", "need a finite value >= 0")
    need(math.isfinite(p.top_p) and 0 < p.top_p <= 1, "top_p", "need 0 < top_p <= 1")
    need(p.top_k >= 0, "top_k", "need >= 0 (0 = no cut)")
    need(0 <= p.min_p <= 1, "min_p", "need 0 <= min_p <= 1")
    for field in ("presence_penalty", "frequency_penalty"):
        need(math.isfinite(getattr(p, field)), field, "need a finite value")
    need(math.isfinite(p.repetition_penalty) and p.repetition_penalty > 0, "repetition_penalty",
         "need a finite value > 0")
    bias_ids = [t for t, _ in p.logit_bias]
    if len(bias_ids) > info.max_logit_bias:
        raise SamplerParamsError("logit_bias", f"entries: {len(bias_ids)} > {info.max_logit_bias}")
    if any(not 0 <= t < info.vocab_size for t in bias_ids) or len(set(bias_ids)) != len(bias_ids):
        raise SamplerParamsError("logit_bias", f"token ids must be distinct and in 0 to {info.vocab_size - 1}")
    if not all(math.isfinite(b) for _, b in p.logit_bias):
        raise SamplerParamsError("logit_bias", "value is not finite")
    need(p.min_tokens >= 0, "min_tokens", "need >= 0")
    if len(p.min_tokens_stop_ids) > info.max_min_tokens_stop_ids:
        raise SamplerParamsError("min_tokens_stop_ids", f"has {len(p.min_tokens_stop_ids)} ids > "
                                 f"{info.max_min_tokens_stop_ids}")
    if any(not 0 <= t < info.vocab_size for t in p.min_tokens_stop_ids):
        raise SamplerParamsError("min_tokens_stop_ids", f"outside 0 to {info.vocab_size - 1}")
    for field in ("logprobs", "prompt_logprobs"):
        need(-1 <= getattr(p, field) <= info.max_logprobs, field,
             f"need -1 to max_logprobs {info.max_logprobs}")
    if len(p.grammar.encode("utf-8", "surrogatepass")) > MAX_GRAMMAR_BYTES:
        raise SamplerParamsError("grammar", f"has {len(p.grammar)} characters: more than {MAX_GRAMMAR_BYTES} bytes")
