"""Domain types of the step protocol on the executor side (no protobuf here; wire.py converts).

A request's data crosses once (NewRequest), then only deltas (CachedRequest). Decode rows
carry no token ids: past the tokens it was sent, a request's input is the token the executor
sampled for it last, kept on the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = no top-k cut
    top_p: float = 1.0  # 1 = no nucleus cut
    seed: int = 0  # sampling is a pure function of (seed, position)


@dataclass
class NewRequest:
    """A request the executor has not seen (or sees again after preemption)."""

    req_id: int
    token_ids: list[int]  # prompt plus tokens generated before a preemption
    sampling: SamplingParams
    block_ids: list[int]  # KV blocks, in order
    num_computed_tokens: int  # tokens whose KV is already cached (prefix hits)
    num_scheduled_tokens: int  # tokens to compute this step, from num_computed_tokens


@dataclass
class CachedRequest:
    """A request the executor holds, scheduled again."""

    req_id: int
    new_block_ids: list[int]  # blocks appended since the last step
    num_scheduled_tokens: int


@dataclass
class StepPlan:
    step_id: int
    new_requests: list[NewRequest] = field(default_factory=list)
    cached_requests: list[CachedRequest] = field(default_factory=list)
    finished_req_ids: list[int] = field(default_factory=list)  # forget (finished or aborted)
    preempted_req_ids: list[int] = field(default_factory=list)  # forget; resent in full later
    decode_req_ids: list[int] = field(default_factory=list)  # held rows computing one token, no new block


@dataclass
class StepOutput:
    """One sampled token per request that completed its known tokens, in plan order."""

    step_id: int
    req_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    prepare_us: int = 0
    forward_us: int = 0
    sample_us: int = 0
    graph_size: int = 0  # batch size of the replayed CUDA graph; 0 = eager

    def sampled(self) -> dict[int, int]:
        return dict(zip(self.req_ids, self.token_ids))


@dataclass(frozen=True)
class ExecutorInfo:
    """What the executor loaded and allocated (the handshake answer)."""

    model_name: str
    model_path: str
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    max_model_len: int
    block_size: int
    num_blocks: int  # null block 0 included
    cuda_graph_sizes: tuple[int, ...]  # captured, ascending; () when eager
    max_num_seqs: int
    max_num_batched_tokens: int
    device: str
    dtype: str
