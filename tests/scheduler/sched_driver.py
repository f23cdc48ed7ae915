"""Test helpers: a fake deterministic "model" behind a fake executor, and drivers that run a
Scheduler synchronously or one step ahead."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler_svc.request import FinishReason, Request, SamplingParams
from scheduler_svc.scheduler import Scheduler, SchedulerCoreConfig
from scheduler_svc.scheduler_output import SchedulerOutput

EOS = 27  # the fake vocabulary: 0..25 are 'a'..'z', 26 is ' ', 27 is EOS, 28 is '!'
VOCAB = 29


def make_config(**overrides) -> SchedulerCoreConfig:
    values = dict(num_blocks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=32,
                  max_model_len=128, long_prefill_token_threshold=0, eos_token_ids=(EOS,))
    return SchedulerCoreConfig(**{**values, **overrides})


def letter(token_id: int) -> str:
    return {26: " ", 27: "<eos>", 28: "!"}.get(token_id) or chr(ord("a") + token_id)


class LetterDetokenizer:
    """One character per token."""

    def step(self, token_id: int) -> str:
        return letter(token_id)


def make_scheduler(**overrides) -> Scheduler:
    return Scheduler(make_config(**overrides), lambda request: LetterDetokenizer())


def fake_next_token(token_ids: list[int]) -> int:
    """The fake model: the next token depends on every token before it."""
    return (sum(token_ids) * 7 + len(token_ids) * 3 + token_ids[-1]) % VOCAB


def reference_tokens(prompt: list[int], num_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(num_tokens):
        tokens.append(fake_next_token(tokens))
    return tokens[len(prompt):]


@dataclass
class Row:
    token_ids: list[int]
    block_ids: list[int]
    num_computed_tokens: int


class FakeExecutor:
    """Keeps rows as the real executor would: token ids cross once, then it feeds its own
    samples. A fake KV cache (slot -> (req_id, position, token)) checks that no request's
    blocks are written by another while it still uses them."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.rows: dict[int, Row] = {}
        self.kv: dict[int, tuple[int, int, int]] = {}

    def execute(self, plan: SchedulerOutput) -> dict[int, int]:
        for req_id in plan.finished_req_ids + plan.preempted_req_ids:
            del self.rows[req_id]
        for new in plan.new_requests:
            assert new.req_id not in self.rows
            self.rows[new.req_id] = Row(list(new.token_ids), list(new.block_ids),
                                        new.num_computed_tokens)
        sampled = {}
        scheduled = ([(r.req_id, r.num_scheduled_tokens) for r in plan.new_requests]
                     + [(r.req_id, r.num_scheduled_tokens) for r in plan.cached_requests])
        for cached in plan.cached_requests:
            self.rows[cached.req_id].block_ids += cached.new_block_ids
        for req_id, num_tokens in scheduled:
            token_id = self._run(req_id, self.rows[req_id], num_tokens)
            if token_id is not None:
                sampled[req_id] = token_id
        return sampled

    def _slot(self, row: Row, position: int) -> int:
        block_id = row.block_ids[position // self.block_size]
        assert block_id != 0, "the null block was handed out"
        return block_id * self.block_size + position % self.block_size

    def _run(self, req_id: int, row: Row, num_tokens: int) -> int | None:
        start, end = row.num_computed_tokens, row.num_computed_tokens + num_tokens
        assert end <= len(row.token_ids), "scheduled a token whose id the executor lacks"
        for p in range(start, end):
            self.kv[self._slot(row, p)] = (req_id, p, row.token_ids[p])
        for p in range(end):  # "attention" reads the whole context
            assert self.kv[self._slot(row, p)] == (req_id, p, row.token_ids[p]), "KV overwritten"
        row.num_computed_tokens = end
        if end < len(row.token_ids):
            return None  # a partial prefill chunk samples nothing
        token_id = fake_next_token(row.token_ids)
        row.token_ids.append(token_id)  # fed as the next input: decode rows carry no ids
        return token_id


@dataclass
class Stream:
    """What a client would have received for one request."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None
    matched_stop: str = ""
    num_outputs: int = 0


def collect(streams: dict[int, Stream], outputs) -> None:
    for out in outputs:
        stream = streams.setdefault(out.req_id, Stream())
        assert stream.finish_reason is None, f"output after the end: {out}"
        stream.token_ids += out.new_token_ids
        stream.text += out.new_text
        stream.finish_reason = out.finish_reason
        stream.matched_stop = out.matched_stop
        stream.num_outputs += 1
        assert out.num_output_tokens == len(stream.token_ids)


def run(scheduler: Scheduler, arrivals: dict[int, list[Request]], aborts=None, *,
        ahead: bool, max_steps: int = 2000) -> tuple[dict[int, Stream], list[SchedulerOutput]]:
    """Drives scheduler and a FakeExecutor to completion. arrivals/aborts are keyed by the
    number of schedule() calls made before they happen. With ahead=True, step N+1 is planned
    before step N's result is applied."""
    aborts = aborts or {}
    executor = FakeExecutor(scheduler.config.block_size)
    streams: dict[int, Stream] = {}
    plans, in_flight = [], []
    for step in range(max_steps):
        for request in arrivals.get(step, []):
            scheduler.add_request(request)
        for req_id in aborts.get(step, []):
            scheduler.abort_request(req_id)
        last_arrival = step >= max(arrivals, default=0) and step >= max(aborts, default=0)
        if last_arrival and not scheduler.has_work():
            break  # results still in flight carry only tokens to discard
        plan = scheduler.schedule()
        plans.append(plan)
        in_flight.append((plan, executor.execute(plan)))
        if not ahead or len(in_flight) == 2:
            collect(streams, scheduler.update_from_output(*in_flight.pop(0)))
    else:
        raise AssertionError("did not finish")
    while in_flight:
        collect(streams, scheduler.update_from_output(*in_flight.pop(0)))
    assert not scheduler.requests and not scheduler.has_work()
    assert scheduler.num_free_blocks == scheduler.num_total_blocks
    return streams, plans


def req(req_id: int, prompt: list[int], max_tokens: int = 16, **params) -> Request:
    return Request(req_id, prompt, SamplingParams(max_tokens=max_tokens, **params))
