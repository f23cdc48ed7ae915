"""The only conversion between the step protocol's domain types and its protobuf messages.

The scheduler encodes plans and decodes results and the handshake; the executor does the
reverse. Columns are copied as columns (packed repeated fields), never split into rows.
"""

from __future__ import annotations

from protos.llmserve.executor.v1 import executor_pb2 as pb
from step_protocol.domain import (CachedRequestData, ExecutorInfo, Logprobs, NewRequestData,
                                 PromptLogprobs, SamplerParams, StepPlan, StepResult)
from step_protocol.plan_rows import without_rows


# What protobuf raises for a value its field cannot hold (out of range, wrong type).
ENCODE_ERRORS = (ValueError, TypeError, OverflowError)


def plan_to_pb(plan: StepPlan) -> pb.StepPlan:
    c = plan.cached_requests
    return pb.StepPlan(
        step_id=plan.step_id,
        new_requests=[_new_to_pb(r) for r in plan.new_requests],
        cached_requests=pb.CachedRequests(
            req_ids=c.req_ids, num_scheduled_tokens=c.num_scheduled_tokens,
            num_new_blocks=c.num_new_blocks, new_block_ids=c.new_block_ids),
        finished_req_ids=plan.finished_req_ids, preempted_req_ids=plan.preempted_req_ids,
        num_draft_tokens=plan.num_draft_tokens, draft_token_ids=plan.draft_token_ids,
        draft_chained=plan.draft_chained)


def plan_to_pb_dropping(plan: StepPlan) -> tuple[pb.StepPlan, list[tuple[int, str]]]:
    """(plan_to_pb(plan), []) — or, when that raises, the plan without the new requests that
    do not encode, and (req_id, why) for each: one request's unencodable value fails that
    request alone. The whole plan is tried first, so a normal step encodes once. Raises what
    plan_to_pb raised when no new request explains it."""
    try:
        return plan_to_pb(plan), []
    except ENCODE_ERRORS:
        failed = []
        for r in plan.new_requests:
            try:
                _new_to_pb(r)
            except ENCODE_ERRORS as e:
                failed.append((r.req_id, f"new request {r.req_id} does not encode: {type(e).__name__}: {e}"))
        if not failed:
            raise
    return plan_to_pb(without_rows(plan, [req_id for req_id, _ in failed])), failed


def _new_to_pb(r: NewRequestData) -> pb.NewRequest:
    return pb.NewRequest(
        req_id=r.req_id, token_ids=r.token_ids, sampler_params=_sampler_to_pb(r.sampler_params),
        block_ids=r.block_ids, num_computed_tokens=r.num_computed_tokens,
        num_scheduled_tokens=r.num_scheduled_tokens, num_prompt_tokens=r.num_prompt_tokens)


def plan_from_pb(msg: pb.StepPlan) -> StepPlan:
    c = msg.cached_requests
    return StepPlan(
        step_id=msg.step_id,
        new_requests=[
            NewRequestData(
                req_id=r.req_id, token_ids=list(r.token_ids),
                sampler_params=_sampler_from_pb(r.sampler_params), block_ids=list(r.block_ids),
                num_computed_tokens=r.num_computed_tokens, num_scheduled_tokens=r.num_scheduled_tokens,
                num_prompt_tokens=r.num_prompt_tokens)
            for r in msg.new_requests],
        cached_requests=CachedRequestData(
            req_ids=list(c.req_ids), num_scheduled_tokens=list(c.num_scheduled_tokens),
            num_new_blocks=list(c.num_new_blocks), new_block_ids=list(c.new_block_ids)),
        finished_req_ids=list(msg.finished_req_ids), preempted_req_ids=list(msg.preempted_req_ids),
        num_draft_tokens=list(msg.num_draft_tokens), draft_token_ids=list(msg.draft_token_ids),
        draft_chained=list(msg.draft_chained))


def result_to_pb(result: StepResult) -> pb.StepResult:
    msg = pb.StepResult(
        step_id=result.step_id, req_ids=result.req_ids, token_ids=result.token_ids,
        prepare_us=result.prepare_us, forward_us=result.forward_us, sample_us=result.sample_us,
        graph_size=result.graph_size, queued_us=result.queued_us, launch_us=result.launch_us,
        launch_cpu_us=result.launch_cpu_us, device_idle_us=result.device_idle_us, error=result.error, num_tokens=result.num_tokens,
        failed_req_ids=result.failed_req_ids, failed_errors=result.failed_errors)
    if result.logprobs is not None:
        msg.logprobs.CopyFrom(_logprobs_to_pb(result.logprobs))
    p = result.prompt_logprobs
    if p is not None:
        msg.prompt_logprobs.CopyFrom(pb.PromptLogprobs(
            req_ids=p.req_ids, first_positions=p.first_positions, counts=p.counts,
            values=_logprobs_to_pb(p.values)))
    return msg


def result_from_pb(msg: pb.StepResult) -> StepResult:
    result = StepResult(
        step_id=msg.step_id, req_ids=list(msg.req_ids), token_ids=list(msg.token_ids),
        prepare_us=msg.prepare_us, forward_us=msg.forward_us, sample_us=msg.sample_us,
        graph_size=msg.graph_size, queued_us=msg.queued_us, launch_us=msg.launch_us,
        launch_cpu_us=msg.launch_cpu_us, device_idle_us=msg.device_idle_us, error=msg.error, num_tokens=list(msg.num_tokens),
        failed_req_ids=list(msg.failed_req_ids), failed_errors=list(msg.failed_errors))
    if msg.HasField("logprobs"):
        result.logprobs = _logprobs_from_pb(msg.logprobs)
    if msg.HasField("prompt_logprobs"):
        p = msg.prompt_logprobs
        result.prompt_logprobs = PromptLogprobs(
            list(p.req_ids), list(p.first_positions), list(p.counts), _logprobs_from_pb(p.values))
    return result


def _logprobs_to_pb(lp: Logprobs) -> pb.Logprobs:
    return pb.Logprobs(num_top=lp.num_top, token_ids=lp.token_ids, logprobs=lp.logprobs,
                       ranks=lp.ranks, top_token_ids=lp.top_token_ids, top_logprobs=lp.top_logprobs)


def _logprobs_from_pb(m: pb.Logprobs) -> Logprobs:
    return Logprobs(m.num_top, list(m.token_ids), list(m.logprobs), list(m.ranks),
                    list(m.top_token_ids), list(m.top_logprobs))


def info_to_pb(info: ExecutorInfo) -> pb.ExecutorInfo:
    return pb.ExecutorInfo(
        model_name=info.model_name, model_path=info.model_path, vocab_size=info.vocab_size,
        eos_token_ids=list(info.eos_token_ids), max_model_len=info.max_model_len,
        block_size=info.block_size, num_blocks=info.num_blocks,
        cuda_graph_sizes=list(info.cuda_graph_sizes), max_num_seqs=info.max_num_seqs,
        max_num_batched_tokens=info.max_num_batched_tokens, device=info.device, dtype=info.dtype,
        max_logprobs=info.max_logprobs, max_logit_bias=info.max_logit_bias,
        max_min_tokens_stop_ids=info.max_min_tokens_stop_ids, draft_model_path=info.draft_model_path)


def info_from_pb(m: pb.ExecutorInfo) -> ExecutorInfo:
    return ExecutorInfo(
        model_name=m.model_name, model_path=m.model_path, vocab_size=m.vocab_size,
        eos_token_ids=tuple(m.eos_token_ids), max_model_len=m.max_model_len,
        block_size=m.block_size, num_blocks=m.num_blocks,
        cuda_graph_sizes=tuple(m.cuda_graph_sizes), max_num_seqs=m.max_num_seqs,
        max_num_batched_tokens=m.max_num_batched_tokens, device=m.device, dtype=m.dtype,
        max_logprobs=m.max_logprobs, max_logit_bias=m.max_logit_bias,
        max_min_tokens_stop_ids=m.max_min_tokens_stop_ids, draft_model_path=m.draft_model_path)


def _sampler_to_pb(p: SamplerParams) -> pb.SamplerParams:
    return pb.SamplerParams(
        temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, seed=p.seed, min_p=p.min_p,
        presence_penalty=p.presence_penalty, frequency_penalty=p.frequency_penalty,
        repetition_penalty=p.repetition_penalty,
        logit_bias_token_ids=[t for t, _ in p.logit_bias], logit_bias_values=[b for _, b in p.logit_bias],
        min_tokens=p.min_tokens, min_tokens_stop_ids=p.min_tokens_stop_ids,
        logprobs=p.logprobs, prompt_logprobs=p.prompt_logprobs, grammar=p.grammar)


def _sampler_from_pb(m: pb.SamplerParams) -> SamplerParams:
    # A length mismatch of the bias columns is the executor's plan check to refuse; zip
    # would hide it, so the shorter column is padded with what fails the check (NaN, id -1).
    ids, values = list(m.logit_bias_token_ids), list(m.logit_bias_values)
    values += [float("nan")] * (len(ids) - len(values))
    ids += [-1] * (len(values) - len(ids))
    return SamplerParams(
        temperature=m.temperature, top_k=m.top_k, top_p=m.top_p, seed=m.seed, min_p=m.min_p,
        presence_penalty=m.presence_penalty, frequency_penalty=m.frequency_penalty,
        repetition_penalty=m.repetition_penalty or 1.0, logit_bias=tuple(zip(ids, values)),
        min_tokens=m.min_tokens, min_tokens_stop_ids=tuple(m.min_tokens_stop_ids),
        logprobs=m.logprobs, prompt_logprobs=m.prompt_logprobs, grammar=m.grammar)
