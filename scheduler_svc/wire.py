"""The scheduler's only bridge between domain objects and protobuf messages."""

from __future__ import annotations

from dataclasses import dataclass

from protos.llmserve.executor.v1 import executor_pb2 as epb
from protos.llmserve.v1 import llmserve_pb2 as pb
from scheduler_svc.request import FinishReason, SamplingParams
from scheduler_svc.scheduler_output import RequestOutput, SchedulerOutput
from scheduler_svc.validation import RawParams


@dataclass(frozen=True)
class ExecutorInfo:
    """What the executor reported in the handshake."""

    model_name: str
    model_path: str
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    max_model_len: int
    block_size: int
    num_blocks: int
    cuda_graph_sizes: tuple[int, ...]
    max_num_seqs: int
    max_num_batched_tokens: int
    device: str
    dtype: str


def executor_info_from_pb(m: epb.ExecutorInfo) -> ExecutorInfo:
    return ExecutorInfo(
        model_name=m.model_name, model_path=m.model_path, vocab_size=m.vocab_size,
        eos_token_ids=tuple(m.eos_token_ids), max_model_len=m.max_model_len,
        block_size=m.block_size, num_blocks=m.num_blocks,
        cuda_graph_sizes=tuple(m.cuda_graph_sizes), max_num_seqs=m.max_num_seqs,
        max_num_batched_tokens=m.max_num_batched_tokens, device=m.device, dtype=m.dtype,
    )


def _sampling_to_pb(p: SamplingParams) -> epb.SamplingParams:
    return epb.SamplingParams(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, seed=p.seed)


def plan_to_pb(out: SchedulerOutput) -> epb.StepPlan:
    """A scheduler decision as the wire plan: full data for new requests, deltas for the rest."""
    return epb.StepPlan(
        step_id=out.step_id,
        new_requests=[
            epb.NewRequest(
                req_id=r.req_id, token_ids=r.token_ids, sampling=_sampling_to_pb(r.params),
                block_ids=r.block_ids, num_computed_tokens=r.num_computed_tokens,
                num_scheduled_tokens=r.num_scheduled_tokens,
            )
            for r in out.new_requests
        ],
        cached_requests=[
            epb.CachedRequest(
                req_id=r.req_id, new_block_ids=r.new_block_ids,
                num_scheduled_tokens=r.num_scheduled_tokens,
            )
            for r in out.cached_requests
            if r.new_block_ids or r.num_scheduled_tokens != 1
        ],
        decode_req_ids=[
            r.req_id for r in out.cached_requests if not r.new_block_ids and r.num_scheduled_tokens == 1
        ],
        finished_req_ids=out.finished_req_ids,
        preempted_req_ids=out.preempted_req_ids,
    )


def sampled_from_pb(result: epb.StepResult) -> dict[int, int]:
    """req_id -> sampled token id for each request that sampled in the step."""
    return dict(zip(result.req_ids, result.token_ids))


_FINISH_TO_PB = {
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.EOS: pb.FINISH_REASON_EOS,
    FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED,
}


def response_to_pb(request_id: str, out: RequestOutput) -> pb.GenerateResponse:
    """One streamed message; the final one carries finish reason and usage."""
    msg = pb.GenerateResponse(request_id=request_id, token_ids=out.new_token_ids, text=out.new_text)
    if out.finish_reason is not None:
        msg.finish_reason = _FINISH_TO_PB[out.finish_reason]
        msg.matched_stop = out.matched_stop
        msg.usage.prompt_tokens = out.num_prompt_tokens
        msg.usage.completion_tokens = out.num_output_tokens
    return msg


def raw_params_from_pb(p: pb.SamplingParams) -> RawParams:
    """The client's sampling fields, with proto3 `optional` presence kept as None."""
    return RawParams(
        max_tokens=p.max_tokens if p.HasField("max_tokens") else None,
        temperature=p.temperature if p.HasField("temperature") else None,
        top_k=p.top_k,
        top_p=p.top_p if p.HasField("top_p") else None,
        seed=p.seed if p.HasField("seed") else None,
        stop=tuple(p.stop),
        stop_token_ids=tuple(p.stop_token_ids),
        ignore_eos=p.ignore_eos,
    )


def chat_from_pb(chat: pb.ChatMessages) -> tuple[list[dict[str, str]], bool]:
    messages = [{"role": m.role, "content": m.content} for m in chat.messages]
    add_generation_prompt = chat.add_generation_prompt if chat.HasField("add_generation_prompt") else True
    return messages, add_generation_prompt
