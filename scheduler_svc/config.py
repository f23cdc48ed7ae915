"""Scheduler service configuration: read once at start (flags, then LLMSERVE_* env), then frozen."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerConfig:
    """Everything the scheduler service needs; built once by from_args and passed down."""

    host: str = "127.0.0.1"
    port: int = 50051
    executor_address: str = "127.0.0.1:50061"
    # Tokenizer folder; empty = the folder the executor reports it loaded.
    tokenizer: str = ""
    # Upper bounds applied on top of what the executor's handshake allows (0 = executor's).
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    # Prompts longer than this are prefilled in chunks of at most this many tokens per step.
    long_prefill_token_threshold: int = 2048
    # Requests allowed to wait for admission; beyond, new requests get RESOURCE_EXHAUSTED.
    max_waiting: int = 4096
    # Plan step N+1 while the executor runs step N (issue 4); False = strict plan/wait/apply.
    overlap: bool = True
    # Tokens per streamed message (the last message may hold fewer); 1 = every step's token.
    # Larger values cut the per-message cost of many concurrent streams.
    stream_interval: int = 1
    # Seconds to wait for the executor at start.
    executor_connect_timeout: float = 300.0
    # Prometheus metrics HTTP port; 0 = off.
    metrics_port: int = 0
    log_level: str = "INFO"


def _env(name: str, default):
    value = os.environ.get(f"LLMSERVE_SCHEDULER_{name}")
    if value is None:
        return default
    if isinstance(default, bool):
        return value.lower() in ("1", "true", "yes", "on")
    return type(default)(value)


def build_parser() -> argparse.ArgumentParser:
    d = SchedulerConfig()
    p = argparse.ArgumentParser(
        prog="llmserve-scheduler",
        description="llmserve scheduler: public gRPC API, batching, KV-block bookkeeping (no GPU).",
    )
    p.add_argument("--host", default=_env("HOST", d.host))
    p.add_argument("--port", type=int, default=_env("PORT", d.port))
    p.add_argument("--executor-address", default=_env("EXECUTOR_ADDRESS", d.executor_address))
    p.add_argument("--tokenizer", default=_env("TOKENIZER", d.tokenizer),
                   help="tokenizer folder (default: the model folder the executor reports)")
    p.add_argument("--max-num-seqs", type=int, default=_env("MAX_NUM_SEQS", d.max_num_seqs))
    p.add_argument("--max-num-batched-tokens", type=int,
                   default=_env("MAX_NUM_BATCHED_TOKENS", d.max_num_batched_tokens))
    p.add_argument("--long-prefill-token-threshold", type=int,
                   default=_env("LONG_PREFILL_TOKEN_THRESHOLD", d.long_prefill_token_threshold))
    p.add_argument("--max-waiting", type=int, default=_env("MAX_WAITING", d.max_waiting))
    p.add_argument("--no-overlap", dest="overlap", action="store_false",
                   default=_env("OVERLAP", d.overlap),
                   help="wait for each step's result before planning the next")
    p.add_argument("--stream-interval", type=int, default=_env("STREAM_INTERVAL", d.stream_interval),
                   help="tokens per streamed message (1 = every token as soon as it is sampled)")
    p.add_argument("--executor-connect-timeout", type=float,
                   default=_env("EXECUTOR_CONNECT_TIMEOUT", d.executor_connect_timeout))
    p.add_argument("--metrics-port", type=int, default=_env("METRICS_PORT", d.metrics_port))
    p.add_argument("--log-level", default=_env("LOG_LEVEL", d.log_level))
    return p


def from_args(argv: list[str] | None = None) -> SchedulerConfig:
    """Parses flags (environment variables LLMSERVE_SCHEDULER_<FLAG> give the defaults)."""
    return SchedulerConfig(**vars(build_parser().parse_args(argv)))
