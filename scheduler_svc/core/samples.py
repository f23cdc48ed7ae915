"""Parallel sampling (n > 1): the samples of one client request, and the hold that lets
samples 1..n-1 reuse the KV blocks of sample 0's prompt instead of computing them again.

The samples are ordinary requests of their own (own ids, blocks, stop rules), as vLLM's
child requests are. A block becomes shareable only once a step that wrote it has been
applied (kv_cache_manager.py), so samples admitted with their leader would each compute the
prompt. Instead samples 1..n-1 are held out of the waiting queue until the leader's prompt KV
is written: then the prefix-cache lookup of each finds every full block of the prompt (all
but the block holding the last prompt token, which a hit never covers). A leader that is
preempted or finishes (aborted, or done) releases its samples at once: they then compute
what the cache no longer holds. Without prefix caching nothing is held.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from .request import Request, RequestStatus, SamplingParams

_SEED_MOD = 1 << 64  # seeds are uint64 on the public API


def sample_requests(req_id: int, prompt_token_ids: list[int], params: SamplingParams) -> list[Request]:
    """The params.n samples of one client request: ids req_id .. req_id + n - 1; sample i is
    seeded seed + i (the API draws a random seed when the client set none); only sample 0
    asks for prompt logprobs (the prompt is the same), so the others may hit the cache."""
    if params.n == 1:
        return [Request(req_id, prompt_token_ids, params)]
    leader = Request(req_id, prompt_token_ids, replace(params, n=1))
    samples = [leader]
    for i in range(1, params.n):
        p = replace(params, n=1, seed=(params.seed + i) % _SEED_MOD, prompt_logprobs=None)
        sample = Request(req_id + i, leader.prompt_token_ids, p)
        sample.leader = leader
        samples.append(sample)
    return samples


class HeldSamples:
    """Samples waiting for their leader's prompt KV, kept out of the waiting queue (at most
    n - 1 per leader; each is a live request of the scheduler)."""

    def __init__(self, block_size: int, enabled: bool):
        self.block_size = block_size
        self.enabled = enabled  # prefix caching on: holding pays off
        self._held: dict[int, list[Request]] = {}  # leader req_id -> its held samples
        self.num_held = 0

    def __contains__(self, leader_id: int) -> bool:
        return leader_id in self._held

    def hold(self, request: Request) -> bool:
        """Holds a new sample whose leader has not written its prompt yet; False when it may
        wait for admission right away."""
        leader = request.leader
        if not self.enabled or leader is None or not self._shared_tokens(leader) or self._ready(leader):
            return False
        self._held.setdefault(leader.req_id, []).append(request)
        self.num_held += 1
        return True

    def remove(self, request: Request) -> bool:
        """Forgets a held sample (it was aborted); False when it was not held."""
        leader = request.leader
        held = self._held.get(leader.req_id) if leader is not None else None
        if held is None or request not in held:
            return False
        held.remove(request)
        self.num_held -= 1
        if not held:
            del self._held[leader.req_id]
        return True

    def release(self, leader: Request, waiting: deque[Request]) -> None:
        """Moves the leader's held samples into the waiting queue (in arrival order) once its
        prompt KV is written, or it was preempted or finished."""
        if leader.req_id not in self._held or not self._ready(leader):
            return
        samples = self._held.pop(leader.req_id)
        self.num_held -= len(samples)
        first = samples[0].arrival_order
        pos = next((i for i, r in enumerate(waiting)
                    if r.status is RequestStatus.WAITING and r.arrival_order > first), len(waiting))
        for j, sample in enumerate(samples):
            waiting.insert(pos + j, sample)

    def _ready(self, leader: Request) -> bool:
        if leader.status is RequestStatus.WAITING:
            return False
        if leader.status is not RequestStatus.RUNNING:  # preempted or finished: wait no more
            return True
        return leader.num_written_tokens >= self._shared_tokens(leader)

    def _shared_tokens(self, leader: Request) -> int:
        """Prompt tokens a later sample can find in the cache: the full blocks before the
        last prompt token."""
        return (leader.num_prompt_tokens - 1) // self.block_size * self.block_size
