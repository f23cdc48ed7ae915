"""The only protobuf <-> domain conversion of the executor."""

from __future__ import annotations

from executor_svc.plan import (CachedRequest, ExecutorInfo, NewRequest, SamplingParams, StepOutput,
                               StepPlan)
from protos.llmserve.executor.v1 import executor_pb2 as pb


def plan_from_pb(msg: pb.StepPlan) -> StepPlan:
    return StepPlan(
        step_id=msg.step_id,
        new_requests=[
            NewRequest(
                req_id=r.req_id, token_ids=list(r.token_ids),
                sampling=SamplingParams(temperature=r.sampling.temperature, top_k=r.sampling.top_k,
                                        top_p=r.sampling.top_p, seed=r.sampling.seed),
                block_ids=list(r.block_ids), num_computed_tokens=r.num_computed_tokens,
                num_scheduled_tokens=r.num_scheduled_tokens)
            for r in msg.new_requests],
        cached_requests=[
            CachedRequest(req_id=r.req_id, new_block_ids=list(r.new_block_ids),
                          num_scheduled_tokens=r.num_scheduled_tokens)
            for r in msg.cached_requests],
        decode_req_ids=list(msg.decode_req_ids),
        finished_req_ids=list(msg.finished_req_ids),
        preempted_req_ids=list(msg.preempted_req_ids),
    )


def plan_to_pb(plan: StepPlan) -> pb.StepPlan:
    """The inverse of plan_from_pb (for tests and tools; the scheduler has its own)."""
    return pb.StepPlan(
        step_id=plan.step_id,
        new_requests=[
            pb.NewRequest(
                req_id=r.req_id, token_ids=r.token_ids,
                sampling=pb.SamplingParams(temperature=r.sampling.temperature, top_k=r.sampling.top_k,
                                           top_p=r.sampling.top_p, seed=r.sampling.seed),
                block_ids=r.block_ids, num_computed_tokens=r.num_computed_tokens,
                num_scheduled_tokens=r.num_scheduled_tokens)
            for r in plan.new_requests],
        cached_requests=[
            pb.CachedRequest(req_id=r.req_id, new_block_ids=r.new_block_ids,
                             num_scheduled_tokens=r.num_scheduled_tokens)
            for r in plan.cached_requests],
        decode_req_ids=plan.decode_req_ids,
        finished_req_ids=plan.finished_req_ids, preempted_req_ids=plan.preempted_req_ids,
    )


def result_to_pb(out: StepOutput) -> pb.StepResult:
    return pb.StepResult(
        step_id=out.step_id, req_ids=out.req_ids, token_ids=out.token_ids,
        prepare_us=out.prepare_us, forward_us=out.forward_us, sample_us=out.sample_us,
        graph_size=out.graph_size)


def error_to_pb(step_id: int, error: str) -> pb.StepResult:
    return pb.StepResult(step_id=step_id, error=error)


def result_from_pb(msg: pb.StepResult) -> StepOutput:
    return StepOutput(
        step_id=msg.step_id, req_ids=list(msg.req_ids), token_ids=list(msg.token_ids),
        prepare_us=msg.prepare_us, forward_us=msg.forward_us, sample_us=msg.sample_us,
        graph_size=msg.graph_size)


def info_to_pb(info: ExecutorInfo) -> pb.ExecutorInfo:
    return pb.ExecutorInfo(
        model_name=info.model_name, model_path=info.model_path, vocab_size=info.vocab_size,
        eos_token_ids=list(info.eos_token_ids), max_model_len=info.max_model_len,
        block_size=info.block_size, num_blocks=info.num_blocks,
        cuda_graph_sizes=list(info.cuda_graph_sizes), max_num_seqs=info.max_num_seqs,
        max_num_batched_tokens=info.max_num_batched_tokens, device=info.device, dtype=info.dtype)
