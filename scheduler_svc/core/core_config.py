"""The scheduler core's configuration (re-exported by core/scheduler.py)."""

from __future__ import annotations

from dataclasses import dataclass

from llmserve.speculative import SpecDecodeConfig


@dataclass(frozen=True)
class SchedulerCoreConfig:
    """What the scheduler core needs; built from the executor handshake and the flags."""

    num_blocks: int  # KV blocks in the executor's cache, including the null block 0
    block_size: int  # tokens per block
    max_num_seqs: int  # most requests running at once
    max_num_batched_tokens: int  # token budget of one step
    max_model_len: int  # prompt + output never exceed this
    long_prefill_token_threshold: int = 0  # most prefill tokens of one request per step; 0 = off
    eos_token_ids: tuple[int, ...] = ()
    enable_prefix_caching: bool = True  # share the KV of equal prefixes (docs/scheduler.md)
    speculative: SpecDecodeConfig | None = None  # n-gram speculative decoding; None = off
