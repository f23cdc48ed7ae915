"""A sampled token's output (token_output: the stop rules, and the logprobs with it), and the
logprobs from a step's result to its requests' outputs.

The executor answers one row per sampled request (StepResult.logprobs, aligned with req_ids)
with the step's largest top-k; each request gets its own k of them. Prompt logprobs arrive
per prefill chunk (StepResult.prompt_logprobs); they are collected on the request (compact
columns: outputs.LogprobColumns) and go out once, with its first output. A prompt computed
again (after preemption) is not delivered again: positions already held are skipped, and
once sent a resumed request no longer asks. A request that asked for nothing costs nothing.
"""

from __future__ import annotations

from step_protocol.domain import Logprobs, PromptLogprobs, StepResult

from .deferred_text import DeferredText
from .outputs import LogprobColumns, LogprobEntry, RequestOutput
from .request import Request
from .stop import process_token


class StepResultError(RuntimeError):
    """A step result that breaks the protocol (a row that had to sample got no token, or
    logprobs that do not match the rows)."""


def entry(lp: Logprobs, i: int, k: int) -> LogprobEntry:
    """Position i of lp with at most k alternatives."""
    n = lp.num_top
    start = i * n
    end = start + min(k, n)
    return (lp.token_ids[i], lp.logprobs[i], lp.ranks[i], lp.top_token_ids[start:end],
            lp.top_logprobs[start:end])


class StepLogprobs:
    """The sampled-token logprobs of one step, found by request."""

    def __init__(self, result: StepResult | None):
        self._lp = result.logprobs if result is not None else None
        self._rows: dict[int, int] | None = None
        self._req_ids = result.req_ids if result is not None else []
        if self._lp is not None and len(self._lp) != len(self._req_ids):
            raise StepResultError(f"step {result.step_id}: {len(self._lp)} logprob rows for "
                                  f"{len(self._req_ids)} sampled requests")

    def for_request(self, request: Request) -> list[LogprobEntry] | None:
        """The request's entry for its token of this step, as a one-item list; None when it
        did not ask."""
        k = request.params.logprobs
        if k is None:
            return None
        if self._lp is None:
            raise StepResultError(f"request {request.req_id} asked for logprobs; the step sent none")
        if self._rows is None:
            self._rows = {req_id: i for i, req_id in enumerate(self._req_ids)}
        return [entry(self._lp, self._rows[request.req_id], k)]


def collect_prompt_logprobs(requests: dict[int, Request], plp: PromptLogprobs) -> None:
    """Appends each request's new prompt positions (in order, each once) to its columns."""
    offset = 0
    for req_id, first, count in zip(plp.req_ids, plp.first_positions, plp.counts):
        request = requests.get(req_id)
        if request is not None and request.wants_prompt_logprobs and not request.is_finished:
            columns = request.prompt_logprobs
            if columns is None:  # position 0, the first prompt token, has none
                columns = request.prompt_logprobs = LogprobColumns.starting_with(
                    request.prompt_token_ids[0], request.params.prompt_logprobs)
            skip = len(columns) - first  # positions held already (a recomputed prompt)
            end = min(count, request.num_prompt_tokens - first)  # never past the prompt
            if first <= len(columns) and end > skip:  # (a gap would be the executor's bug)
                columns.extend_from(plp.values, offset + max(skip, 0), end - max(skip, 0))
        offset += count


def take_prompt_logprobs(request: Request) -> LogprobColumns | None:
    """The prompt logprobs for the request's first output; None when it did not ask or they
    went out already."""
    if not request.wants_prompt_logprobs:
        return None
    columns = request.prompt_logprobs or LogprobColumns.starting_with(
        request.prompt_token_ids[0], request.params.prompt_logprobs)
    request.prompt_logprobs, request.prompt_logprobs_sent = None, True
    return columns


def continuing_output(request: Request, token_id: int, deferred: DeferredText) -> RequestOutput | None:
    """token_output of a token that cannot end the request (no stop string could, it is no
    stop or EOS id, the length is not reached) of a request without logprobs, its text left to
    deferred (deferred_text.py); None for any other token, which token_output must apply."""
    num_output = len(request.output_token_ids) + 1
    if (not request.defers_text or num_output >= request.num_output_limit
            or token_id in request.finish_token_ids or not request.prompt_logprobs_sent):
        return None
    request.output_token_ids.append(token_id)
    out = RequestOutput(request.req_id, [token_id], "", None, "", len(request.prompt_token_ids), num_output)
    if request.detokenizer is not None:
        deferred.add(out, request.detokenizer)
    return out


def token_output(request: Request, token_id: int, eos_token_ids: tuple[int, ...],
                 max_model_len: int, logprobs: StepLogprobs) -> RequestOutput:
    """Appends a sampled token and applies the stop rules: what it produced for the client,
    its logprobs with it (and the prompt's, on the first output)."""
    request.output_token_ids.append(token_id)
    text, reason, matched = process_token(request, token_id, eos_token_ids, max_model_len)
    return RequestOutput(request.req_id, [token_id], text, reason, matched,
                         len(request.prompt_token_ids), len(request.output_token_ids),
                         None if request.params.logprobs is None else logprobs.for_request(request),
                         None if request.prompt_logprobs_sent else take_prompt_logprobs(request))
