"""Test helpers: a fake deterministic "model" behind a fake executor, plugged into the engine's
own step loop (scheduler_svc/engine/step_loop.py) as its transport."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from scheduler_svc.core.request import FinishReason, Request, SamplingParams
from scheduler_svc.core.scheduler import Scheduler, SchedulerCoreConfig
from scheduler_svc.engine.step_loop import StepLoop
from step_protocol.domain import (CachedRequestData, Logprobs, PromptLogprobs, SamplerParams,
                                  StepPlan, StepResult)

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

    def flush(self) -> str:
        return ""  # holds nothing back


def make_scheduler(**overrides) -> Scheduler:
    # a clock that does not move: no speculation mode trials (core/spec/trials.py), deterministic steps
    return Scheduler(make_config(**overrides), lambda request: LetterDetokenizer(), clock=lambda: 0.0)


def fake_next_token(token_ids: list[int]) -> int:
    """The fake model: the next token depends on every token before it."""
    return (sum(token_ids) * 7 + len(token_ids) * 3 + token_ids[-1]) % VOCAB


def reference_tokens(prompt: list[int], num_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(num_tokens):
        tokens.append(fake_next_token(tokens))
    return tokens[len(prompt):]


def fake_logprob_row(position: int, token_id: int, num_top: int) -> tuple:
    """The fake model's logprobs at a position: (logprob, rank, top ids, top logprobs)."""
    top = [(token_id + 1 + j) % VOCAB for j in range(num_top)]
    return (-0.5 - position / 100 - token_id / 1000, 1 + token_id % 3, top,
            [-0.1 * (j + 1) - position / 1000 for j in range(num_top)])


def fake_logprobs(rows: list[tuple[int, int]], num_top: int) -> Logprobs:
    """Logprobs of (position, token id) rows, as the executor's columns."""
    out = Logprobs(num_top)
    for position, token_id in rows:
        lp, rank, top_ids, top_lps = fake_logprob_row(position, token_id, num_top)
        out.token_ids.append(token_id)
        out.logprobs.append(lp)
        out.ranks.append(rank)
        out.top_token_ids += top_ids
        out.top_logprobs += top_lps
    return out


@dataclass
class Row:
    token_ids: list[int]
    block_ids: list[int]
    num_computed_tokens: int
    params: SamplerParams = field(default_factory=SamplerParams)
    num_prompt_tokens: int = 0


class FakeExecutor:
    """Keeps rows as the real executor would: token ids cross once, then it feeds its own
    samples. A fake KV cache (slot -> (position, every token up to it): what real KV depends
    on) checks that every token a row attends to holds exactly its own prefix: a cached
    prefix must be reused correctly, not just quickly. It also checks the block rules:
    a row writes only blocks no other row holds, a cached prefix was written by a step
    whose result is already back, and a newly handed-out block is in no step in flight."""

    def __init__(self, block_size: int, seeded: bool = False):
        self.block_size = block_size
        self.seeded = seeded  # samples depend on the request's seed too (a sampling model)
        self.rows: dict[int, Row] = {}
        self.kv: dict[int, tuple[int, tuple[int, ...]]] = {}
        self.unapplied: dict[int, int] = {}  # slot -> step that wrote it, result not back yet
        self.inflight_blocks: dict[int, set[int]] = {}  # step id -> blocks its rows hold

    def execute(self, plan: StepPlan) -> StepResult:
        for req_id in plan.finished_req_ids + plan.preempted_req_ids:
            del self.rows[req_id]
        new_blocks = [b for r in plan.new_requests
                      for b in r.block_ids[r.num_computed_tokens // self.block_size:]]
        new_blocks += plan.cached_requests.new_block_ids
        busy = set().union(*self.inflight_blocks.values())
        assert not busy & set(new_blocks), "a block of a step in flight was handed out again"
        for new in plan.new_requests:
            assert new.req_id not in self.rows
            assert 0 < new.num_prompt_tokens <= len(new.token_ids), "num_prompt_tokens not set"
            row = Row(list(new.token_ids), list(new.block_ids), new.num_computed_tokens,
                      new.sampler_params, new.num_prompt_tokens)
            self._check_cached_prefix(row)
            self.rows[new.req_id] = row
        cached = cached_rows(plan.cached_requests)
        for req_id, _, new_block_ids in cached:
            self.rows[req_id].block_ids += new_block_ids
        scheduled = ([(r.req_id, r.num_scheduled_tokens) for r in plan.new_requests]
                     + [(req_id, n) for req_id, n, _ in cached])
        self.inflight_blocks[plan.step_id] = {b for r, _ in scheduled for b in self.rows[r].block_ids}
        result = StepResult(plan.step_id)
        prompt_rows: list[tuple[int, int, list[tuple[int, int]], int]] = []
        for req_id, num_tokens in scheduled:
            row = self.rows[req_id]
            start = row.num_computed_tokens
            token_id = self._run(plan.step_id, req_id, row, num_tokens)
            # the logits of positions start..end-1 give the prompt logprobs of start+1..end
            end = min(start + num_tokens, row.num_prompt_tokens - 1)
            if row.params.prompt_logprobs >= 0 and end > start:
                positions = [(p, row.token_ids[p]) for p in range(start + 1, end + 1)]
                prompt_rows.append((req_id, start + 1, positions, row.params.prompt_logprobs))
            if token_id is not None:
                result.req_ids.append(req_id)
                result.token_ids.append(token_id)
        ks = [self.rows[r].params.logprobs for r in result.req_ids]
        if max(ks, default=-1) >= 0:  # rows that did not ask are there too
            result.logprobs = fake_logprobs(
                [(len(self.rows[r].token_ids) - 1, t) for r, t in zip(result.req_ids, result.token_ids)],
                max(ks))
        if prompt_rows:
            num_top = max(k for *_, k in prompt_rows)
            result.prompt_logprobs = PromptLogprobs(
                [r for r, *_ in prompt_rows], [first for _, first, _, _ in prompt_rows],
                [len(rows) for _, _, rows, _ in prompt_rows],
                fake_logprobs([x for _, _, rows, _ in prompt_rows for x in rows], num_top))
        return result

    def applied(self, step_id: int) -> None:
        """The scheduler receives step_id's result: its KV counts as written from now on."""
        self.inflight_blocks.pop(step_id, None)
        self.unapplied = {slot: s for slot, s in self.unapplied.items() if s != step_id}

    def _check_cached_prefix(self, row: Row) -> None:
        for p in range(row.num_computed_tokens):
            slot = self._slot(row, p)
            assert slot not in self.unapplied, "offered KV that a step in flight is writing"
            assert self.kv.get(slot) == (p, tuple(row.token_ids[:p + 1])), "wrong cached prefix"

    def _slot(self, row: Row, position: int) -> int:
        block_id = row.block_ids[position // self.block_size]
        assert block_id != 0, "the null block was handed out"
        return block_id * self.block_size + position % self.block_size

    def _run(self, step_id: int, req_id: int, row: Row, num_tokens: int) -> int | None:
        start, end = row.num_computed_tokens, row.num_computed_tokens + num_tokens
        assert end <= len(row.token_ids), "scheduled a token whose id the executor lacks"
        for p in range(start, end):
            block_id = row.block_ids[p // self.block_size]
            assert all(block_id not in r.block_ids for i, r in self.rows.items() if i != req_id), \
                "wrote a block another request holds"
            self.kv[self._slot(row, p)] = (p, tuple(row.token_ids[:p + 1]))
            self.unapplied[self._slot(row, p)] = step_id
        for p in range(end):  # "attention" reads the whole context
            assert self.kv[self._slot(row, p)] == (p, tuple(row.token_ids[:p + 1])), "KV overwritten"
        row.num_computed_tokens = end
        if end < len(row.token_ids):
            return None  # a partial prefill chunk samples nothing
        token_id = fake_next_token(row.token_ids)
        if self.seeded:
            token_id = (token_id + row.params.seed * 11) % VOCAB
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
    logprobs: list | None = None
    prompt_logprobs: list | None = None


def collect(streams: dict[int, Stream], outputs, errors=()) -> None:
    assert not errors, errors
    for out in outputs:
        stream = streams.setdefault(out.req_id, Stream())
        assert stream.finish_reason is None, f"output after the end: {out}"
        stream.token_ids += out.new_token_ids
        if out.logprobs is not None:
            assert len(out.logprobs) == len(out.new_token_ids), "logprobs not aligned with tokens"
            assert [e[0] for e in out.logprobs] == out.new_token_ids
            stream.logprobs = (stream.logprobs or []) + out.logprobs
        if out.prompt_logprobs is not None:
            assert stream.prompt_logprobs is None, "prompt logprobs delivered twice"
            stream.prompt_logprobs = out.prompt_logprobs
        stream.text += out.new_text
        stream.finish_reason = out.finish_reason
        stream.matched_stop = out.matched_stop
        stream.num_outputs += 1
        assert out.num_output_tokens == len(stream.token_ids)


class FakeTransport:
    """The step loop's transport to a FakeExecutor: each plan runs when sent; every plan sent
    is kept for the test to inspect."""

    def __init__(self, executor: FakeExecutor):
        self.executor = executor
        self.plans: list[StepPlan] = []
        self._results: deque[StepResult] = deque()

    async def send(self, plan: StepPlan) -> None:
        self.plans.append(plan)
        self._results.append(self.executor.execute(plan))

    async def receive(self) -> StepResult:
        result = self._results.popleft()
        self.executor.applied(result.step_id)
        return result


def cached_rows(cached: CachedRequestData) -> list[tuple[int, int, list[int]]]:
    """(req_id, num_scheduled_tokens, new block ids) per cached row: the columns as rows, for
    assertions."""
    rows, i = [], 0
    for req_id, n, num_blocks in zip(cached.req_ids, cached.num_scheduled_tokens, cached.num_new_blocks):
        rows.append((req_id, n, cached.new_block_ids[i:i + num_blocks]))
        i += num_blocks
    return rows


def run(scheduler: Scheduler, arrivals: dict[int, list[Request]], aborts=None, *,
        ahead: bool | int, max_steps: int = 2000, seeded: bool = False,
        executor: FakeExecutor | None = None) -> tuple[dict[int, Stream], list[StepPlan]]:
    """Drives scheduler and a FakeExecutor to completion through the engine's StepLoop.
    arrivals/aborts are keyed by the number of schedule() calls made before they happen (when
    the engine is idle, time jumps to the next arrival). With ahead=True, step N+1 is planned
    before step N's result is applied; an int is the loop's depth (3: N+1 and N+2)."""
    aborts = aborts or {}
    streams: dict[int, Stream] = {}
    transport = FakeTransport(executor or FakeExecutor(scheduler.config.block_size, seeded))
    depth = (2 if ahead else 1) if isinstance(ahead, bool) else ahead
    loop = StepLoop(scheduler, transport, depth,
                    on_outputs=lambda outputs, errors: collect(streams, outputs, errors))
    events = sorted(set(arrivals) | set(aborts))

    async def drive() -> None:
        clock, done = 0, -1
        for _ in range(2 * max_steps):
            clock = max(clock, loop.num_planned)
            for step in range(done + 1, clock + 1):
                for request in arrivals.get(step, []):
                    scheduler.add_request(request)
                for req_id in aborts.get(step, []):
                    scheduler.abort_request(req_id)
            done = max(done, clock)
            if not await loop.step():
                later = [step for step in events if step > done]
                if not later:
                    return
                clock = later[0]
        raise AssertionError("did not finish")

    asyncio.run(drive())
    failed = scheduler.take_failed()  # requests the core failed alone: none here
    assert not failed, failed
    assert not scheduler.requests and not scheduler.has_work()
    assert scheduler.num_free_blocks == scheduler.num_total_blocks  # cached-but-free count as free
    assert all(b.ref_count == 0 for b in scheduler.kv.pool.blocks[1:])
    return streams, transport.plans


def req(req_id: int, prompt: list[int], max_tokens: int = 16, **params) -> Request:
    return Request(req_id, prompt, SamplingParams(max_tokens=max_tokens, **params))
