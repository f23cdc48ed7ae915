"""Adaptive speculation: which requests speculate this step (no torch).

Speculating costs a request its pipelining: while it speculates it is not planned with a token
in flight (its next drafts need that token, docs/scheduler.md), so it runs one step per round
trip through both services instead of one per step. That pays only while its drafts are
accepted. The gate keeps, per request, an exponential moving average of the drafts accepted per
opportunity (a verify step counts its accepted drafts; a proposal that found nothing counts 0),
starting at k (optimistic). While the average is at least MIN_ACCEPTED the request speculates;
below it, it decodes pipelined like any request, and the gate probes now and then whether
speculation would pay again:
  - n-gram: every LOOKUP_STEPS steps, a lookup of its known tokens' suffix (a few dict reads, no
    GPU work); a match turns speculation back on (the average set just above MIN_ACCEPTED, so
    one fruitless try turns it off again);
  - draft model: nothing to look up without the GPU, so after PROBE_STEPS steps it speculates
    once (a one-step wait), the interval doubling after each fruitless probe up to MAX_PROBE_STEPS.
MIN_ACCEPTED: a fruitless try costs the request one step of pipelining (a fraction of a step of
GPU time at small batch), an accepted draft saves a whole step, so it pays from well below one
accepted draft per try; DECAY 0.25 rides out the one or two failed lookups that follow any break
in a repeated passage (k = 4: eight fruitless tries in a row turn it off).
disable_by_batch_size (vLLM's field): with more running requests than that, nobody speculates.
"""

from __future__ import annotations

from collections.abc import Callable

from ..request import Request
from .ngram import NgramIndex
from .trials import ModeTrials

MIN_ACCEPTED = 0.5  # drafts accepted per opportunity below which a request stops speculating
DECAY = 0.25  # weight of the newest opportunity in the moving average
LOOKUP_STEPS = 4  # n-gram: steps between the lookups of a request that does not speculate
PROBE_STEPS = 16  # draft model: steps before its first probe (then doubling)
MAX_PROBE_STEPS = 256


class GateState:
    """One request's gate: its average, the steps to its next probe, the probe interval, and
    whether a probe (draft model) is waiting for its outcome."""

    __slots__ = ("countdown", "interval", "probing", "score")

    def __init__(self, k: int, countdown: int):
        self.score, self.countdown, self.interval, self.probing = float(k), countdown, PROBE_STEPS, False


class SpecGate:
    """probe(request) -> bool (n-gram): whether the suffix of its known tokens occurs earlier;
    None (draft model): probes speculate. disable_by_batch_size 0 = never."""

    def __init__(self, num_speculative_tokens: int, probe: Callable[[Request], bool] | None,
                 disable_by_batch_size: int = 0):
        self.k, self.probe, self.disable_by_batch_size = num_speculative_tokens, probe, disable_by_batch_size

    def _state(self, request: Request) -> GateState:
        if request.spec_gate is None:
            request.spec_gate = GateState(self.k, PROBE_STEPS if self.probe is None else LOOKUP_STEPS)
        return request.spec_gate

    def speculates(self, request: Request, num_running: int) -> bool:
        """Whether the request speculates this step (it waits for its token in flight, then
        gets drafts). Call once a step per running request: it counts the steps to a probe."""
        if self.disable_by_batch_size and num_running > self.disable_by_batch_size:
            return False
        s = self._state(request)
        if s.score >= MIN_ACCEPTED or s.probing:
            return True
        s.countdown -= 1
        if s.countdown > 0:
            return False
        if self.probe is not None:  # a free probe: back on if its suffix occurs earlier
            s.countdown = LOOKUP_STEPS
            if self.probe(request):
                s.score = 1.25 * MIN_ACCEPTED  # one fruitless try turns it off again
                return True
            return False
        s.interval = min(2 * s.interval, MAX_PROBE_STEPS)  # draft model: speculate once, back off
        s.countdown, s.probing = s.interval, True
        return True

    def chains(self, request: Request, num_running: int) -> bool:
        """Whether a request with verify rows in flight may chain another (no probing: its
        average is at the bar, and the batch is within disable_by_batch_size)."""
        if self.disable_by_batch_size and num_running > self.disable_by_batch_size:
            return False
        return self._state(request).score >= MIN_ACCEPTED

    def observe(self, request: Request, accepted: int) -> None:
        """One opportunity's outcome: the accepted drafts of a verify step, or 0 when the
        proposer found none. An average back at MIN_ACCEPTED resets the probe interval."""
        s = self._state(request)
        s.probing = False
        s.score = (1 - DECAY) * s.score + DECAY * accepted
        if s.score >= MIN_ACCEPTED:
            s.interval = PROBE_STEPS
            s.countdown = PROBE_STEPS if self.probe is None else LOOKUP_STEPS


def ngram_probe(min_n: int, max_n: int) -> Callable[[Request], bool]:
    """The n-gram gate's probe: whether the suffix of the request's known tokens occurs earlier
    (its NgramIndex, shared with the proposer: the same incremental lookup)."""

    def probe(request: Request) -> bool:
        index = request.ngram_index
        if index is None:
            index = request.ngram_index = NgramIndex(min_n, max_n)
        return bool(index.propose(request.token_ids_between, request.num_tokens, 1))

    return probe


class SpecSteps:
    """What the scheduler asks of speculation each step: the SpecDecoder (proposals, settling),
    the per-request gate and the measured mode trials (trials.py)."""

    def __init__(self, decoder, gate: SpecGate, trials: ModeTrials):
        self.decoder, self.gate, self.trials = decoder, gate, trials

    @classmethod
    def for_config(cls, config, decoder, clock: Callable[[], float]) -> SpecSteps:
        probe = ngram_probe(config.prompt_lookup_min, config.prompt_lookup_max) if config.method == "ngram" else None
        return cls(decoder, SpecGate(config.num_speculative_tokens, probe, config.disable_by_batch_size),
                   ModeTrials(clock))

    def speculates(self, request: Request, num_running: int) -> bool:
        """Whether the request speculates this step: always while a verify row of it is in
        flight (it chains another or waits: its rejected slots are rolled back after it), else
        as the measured mode, its sampling and the gate say."""
        return bool(request.spec_rows) or (
            self.trials.on and self.decoder.eligible(request) and self.gate.speculates(request, num_running))

    def on_step(self, sampled: dict) -> None:
        """An applied step's sampled tokens (an int, or a verify row's list), for the trials."""
        self.trials.on_step(sum(1 if isinstance(t, int) else len(t) for t in sampled.values()))

    def plan_row(self, request: Request, num_new_tokens: int, budget: int,
                 num_running: int) -> tuple[int, list[int], bool]:
        """A speculating request's row: (its tokens, its drafts, whether it is chained). With
        num_new_tokens 0 (rows of it in flight) a chained row or none; else that row + drafts."""
        if not num_new_tokens:
            drafts = self.propose_chained(request, budget, num_running)
            return (1 + len(drafts) if drafts else 0), drafts, bool(drafts)
        drafts = self.propose(request, budget - num_new_tokens)
        return num_new_tokens + len(drafts), drafts, False

    def propose(self, request: Request, budget: int) -> list[int]:
        drafts = self.decoder.propose(request, budget)
        if not drafts and request.num_computed_tokens == request.num_tokens - 1:
            self.gate.observe(request, 0)  # a decode row the proposer found nothing for
        return drafts

    def propose_chained(self, request: Request, budget: int, num_running: int) -> list[int]:
        """A chained row's drafts (decoder.propose_chained), only while the measured mode
        and the request's gate are on (else it waits for its rows in flight)."""
        if not self.trials.on or not self.gate.chains(request, num_running):
            return []
        return self.decoder.propose_chained(request, budget)

    def record(self, request: Request, step_id: int, drafts: list[int], chained: bool) -> None:
        self.decoder.record(request, step_id, drafts, chained)

    def settle(self, request: Request, token_ids) -> int:
        """decoder.settle (the slots whose KV is void), the outcome told to the gate (a void
        row is none: it verified nothing)."""
        row = request.spec_rows[0]
        void = self.decoder.settle(request, token_ids)
        if token_ids is not None and not row.void:
            self.gate.observe(request, len(row.drafts) - void)
        return void
