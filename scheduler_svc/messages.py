"""Everything that crosses the pipe between the scheduler's two processes, in one module.

    API process -> engine core:  the SchedulerConfig (once, first), then AddRequest | AbortRequest
    engine core -> API process:  Ready | Failed (once, at start), then Outputs after every
                                 applied step and every batch of commands

The pipe itself (framing, size limit, back-pressure) is scheduler_svc/pipe.py.

Outputs carry each request's RequestOutput as a plain tuple (encode_output / decode_output):
pickling 256 dataclasses took ~0.3 ms a step and unpickling ~0.4 ms; tuples take a seventh of
that. An Outputs message also carries a load snapshot (CoreStats), so the API side's figures
are never older than one step. Errors are (req_id, RequestError); req_id ALL addresses every
request.
"""

from __future__ import annotations


from dataclasses import dataclass, fields
from typing import NamedTuple

from scheduler_svc.core.outputs import RequestOutput
from scheduler_svc.core.request import FinishReason, SamplingParams
from step_protocol.domain import ExecutorInfo

ALL = -1  # req_id of an error meant for every request


class RequestError(Exception):
    """A request the server refuses or could not finish; `code` names the gRPC status to answer
    with ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "UNAVAILABLE", "INTERNAL"). The one error
    type of both processes: validation raises it, the engine core sends it over the pipe.
    `param` names the request field at fault (the domain name, e.g. "max_tokens"; each door
    reports it as its client spelled it), or None."""

    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(code, message, param)
        self.code = code
        self.message = message
        self.param = param

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class AddRequest:
    """A client request: its params.n samples get the ids req_id .. req_id + n - 1 (the API
    process reserves them; core/samples.py makes the requests). The prompt crosses once, and
    with params its structured-output constraint (params.constraint), already validated."""

    req_id: int  # unique within the API process's lifetime
    prompt_token_ids: list[int]
    params: SamplingParams


@dataclass(frozen=True)
class AbortRequest:
    req_id: int


@dataclass(frozen=True)
class Ready:
    """The engine core has handshaken with the executor."""

    info: ExecutorInfo


@dataclass(frozen=True)
class Failed:
    """The engine core could not start."""

    message: str


@dataclass
class CoreStats:
    """Load and running totals, as of the last step (the status RPC and metrics read these)."""

    num_total_blocks: int = 0
    num_free_blocks: int = 0
    num_running: int = 0
    num_waiting: int = 0
    num_steps: int = 0
    num_graph_steps: int = 0
    prepare_us: int = 0
    forward_us: int = 0
    sample_us: int = 0
    # Prefix caching, in tokens of admitted requests: looked up in the cache, found there.
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    executor_available: bool = False  # handshaken and answering; False while (re)connecting
    num_preemptions: int = 0  # requests preempted (each time), since start
    # Speculative decoding (vLLM's spec_decode counters), since start: verify rows (a request's
    # drafts checked in one step), draft tokens proposed, drafts accepted.
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    # Where the steps' time went (µs, summed; StepTimings in the public proto): the step loop's
    # planning + sending, applying results, waiting for results; the executor's plan queueing,
    # launches and device idle.
    schedule_us: int = 0
    apply_us: int = 0
    result_wait_us: int = 0
    apply_deferred_us: int = 0  # the part of apply_us after the next plan was sent
    executor_queued_us: int = 0
    executor_launch_us: int = 0
    executor_launch_cpu_us: int = 0  # the launches' thread CPU time (the rest: GIL waits)
    device_idle_us: int = 0
    # Executor step times (prepare + forward + sample) per bucket of engine/stats.py's
    # STEP_TIME_BUCKETS, not cumulative, the last one above them all (a few ints a message).
    step_time_counts: tuple = ()


_CORE_STATS_FIELDS = tuple(f.name for f in fields(CoreStats))


def stats_tuple(stats: CoreStats) -> tuple:
    """The fields of stats in order, as CoreStats(*t) takes them (dataclasses.astuple copies
    deeply: 14 µs a step against 1)."""
    return tuple(getattr(stats, name) for name in _CORE_STATS_FIELDS)


class Outputs(NamedTuple):
    """One step's (or one command's) results for the API process."""

    outputs: list[tuple]  # encode_output(RequestOutput) each
    errors: list[tuple[int, RequestError]]
    stats: tuple  # stats_tuple(CoreStats)
    # (req_id, time.monotonic()) of requests the scheduler admitted to a step since the last
    # message (a resumed preempted request again: the API side keeps the first). The queue
    # and prefill time metrics need it; CLOCK_MONOTONIC is one clock for all processes.
    scheduled: list | tuple = ()


def encode_output(o: RequestOutput) -> tuple:
    """The generated tokens' logprobs ride along as tuples, the prompt's as arrays
    (LogprobColumns); a request without costs two Nones."""
    return (o.req_id, o.new_token_ids, o.new_text, o.finish_reason and o.finish_reason.value,
            o.matched_stop, o.num_prompt_tokens, o.num_output_tokens, o.logprobs, o.prompt_logprobs)


def decode_output(t: tuple) -> RequestOutput:
    req_id, token_ids, text, reason, matched, num_prompt, num_output, logprobs, prompt_logprobs = t
    return RequestOutput(req_id, token_ids, text, reason and FinishReason(reason), matched,
                         num_prompt, num_output, logprobs, prompt_logprobs)
