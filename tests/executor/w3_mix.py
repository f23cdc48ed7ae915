"""A W3-like serving mix driven through a ModelRunner by a small scheduler (the no-compilation
tests): many requests arriving over time, prompts of varied lengths chunked within the step's
token budget beside the running decodes, outputs of varied lengths (so decode batches of many
sizes), and some requests with temperature, top-k/top-p, logits processors, logprobs, prompt
logprobs or a grammar."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from step_protocol.domain import CachedRequestData, NewRequestData, SamplerParams, StepPlan, StepResult


@dataclass
class Request:
    req_id: int
    prompt: list[int]
    params: SamplerParams
    max_out: int
    blocks: list[int] = field(default_factory=list)
    computed: int = 0  # tokens whose KV is written
    out: list[int] = field(default_factory=list)

    @property
    def prefilling(self) -> bool:
        return self.computed < len(self.prompt)


def params_mix(i: int, vocab: int, grammar: str) -> SamplerParams:
    """Mostly greedy, as W3; one in four requests uses something else."""
    kinds = [SamplerParams(), SamplerParams(temperature=0.9, seed=i),
             SamplerParams(temperature=0.7, top_k=20, top_p=0.9, seed=i),
             SamplerParams(temperature=0.8, seed=i, repetition_penalty=1.2, presence_penalty=0.2,
                           logit_bias=((i % vocab, 2.0),), logprobs=2),
             SamplerParams(prompt_logprobs=1), SamplerParams(logprobs=1),
             SamplerParams(temperature=0.8, seed=i, grammar=grammar) if grammar else SamplerParams()]
    return kinds[0] if i % 4 else kinds[(i // 4) % len(kinds)]


def make_requests(num: int, vocab: int, max_len: int, max_out: int = 24, seed: int = 3,
                  grammar: str = "") -> list[Request]:
    rng = random.Random(seed)
    out = []
    for i in range(num):
        n = rng.choice([rng.randint(1, 40), rng.randint(40, max_len // 2), rng.randint(max_len // 2, max_len)])
        params = params_mix(i, vocab, grammar)
        n_out = 4 if params.grammar else rng.randint(1, max_out)
        out.append(Request(i + 1, [rng.randint(1, vocab - 1) for _ in range(n)], params, n_out))
    return out


class MixScheduler:
    """Continuous batching over `requests` (blocks for prompt + output taken at admission): each
    step decodes every running request, continues partial prefills, then admits new ones, within
    max_num_seqs rows and max_num_batched_tokens tokens; `arrivals` new requests become waiting
    per step."""

    def __init__(self, runner, requests: list[Request], arrivals: int = 8):
        self.runner, self.info = runner, runner.info()
        self.pending, self.waiting, self.running = deque(requests), deque(), []
        self.free = list(range(1, self.info.num_blocks))
        self.arrivals, self.step_id, self.results = arrivals, 0, []
        self.decode_steps: list[tuple[int, int]] = []  # (batch size, graph size) of each decode-only step

    def run(self, max_steps: int = 10_000) -> list[StepResult]:
        while (self.pending or self.waiting or self.running) and self.step_id < max_steps:
            for _ in range(min(self.arrivals, len(self.pending))):
                self.waiting.append(self.pending.popleft())
            self.step()
        assert not (self.pending or self.waiting or self.running), "the mix did not finish"
        return self.results

    def step(self) -> None:
        self.step_id += 1
        plan, budget = StepPlan(self.step_id), self.info.max_num_batched_tokens
        done = [r for r in self.running if len(r.out) >= r.max_out]
        for r in done:
            self.running.remove(r)
            plan.finished_req_ids.append(r.req_id)
            self.free += r.blocks
        cached, scheduled = CachedRequestData(), {}
        for r in self.running:  # decodes first, then the partial prefills
            n = 1 if not r.prefilling else 0
            if n and budget:
                cached.append(r.req_id, n, [])
                scheduled[r.req_id], budget = n, budget - n
        for r in self.running:
            if r.prefilling and budget:
                n = min(len(r.prompt) - r.computed, budget)
                cached.append(r.req_id, n, [])
                scheduled[r.req_id], budget = n, budget - n
        plan.cached_requests = cached
        while self.waiting and budget and len(self.running) < self.info.max_num_seqs:
            r = self.waiting[0]
            need = -(-(len(r.prompt) + r.max_out) // self.info.block_size)
            if need > len(self.free):
                break
            self.waiting.popleft()
            r.blocks, self.free = self.free[:need], self.free[need:]
            n = min(len(r.prompt), budget)
            plan.new_requests.append(NewRequestData(r.req_id, r.prompt, r.params, r.blocks, 0, n,
                                                    num_prompt_tokens=len(r.prompt)))
            scheduled[r.req_id], budget = n, budget - n
            self.running.append(r)
        if not scheduled and not plan.finished_req_ids:
            return
        result = self.runner.execute(plan)
        if scheduled and not plan.new_requests and all(n == 1 for n in scheduled.values()):
            self.decode_steps.append((len(scheduled), result.graph_size))
        assert not result.error and not result.failed_req_ids, (result.error, result.failed_errors)
        for r in self.running:
            r.computed += scheduled.get(r.req_id, 0)
        by_id = {r.req_id: r for r in self.running}
        eos = set(self.info.eos_token_ids)
        for req_id, token in result.sampled().items():
            r = by_id[req_id]
            r.out.append(token)
            if token in eos:  # a request ends at EOS (a grammar's after its match)
                r.max_out = len(r.out)
        self.results.append(result)
