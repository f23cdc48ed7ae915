"""Scheduler service configuration: read once at start (flags, then LLMSERVE_* env), then frozen."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from functools import partial

from llmserve.env import env_default
from llmserve.limits import MAX_STOP_TOKEN_IDS
from llmserve.secret_file import token_or_file
from llmserve.speculative import scheduler_flag


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
    # Automatic prefix caching (vLLM's name): requests whose prompts start alike share the KV
    # blocks of that prefix instead of computing it again (docs/scheduler.md).
    enable_prefix_caching: bool = True
    # Speculative decoding, vLLM's --speculative-config JSON (method "ngram": prompt lookup, or
    # "draft_model": the executor's draft model proposes; docs/scheduler.md "Speculative
    # decoding"); "" = off.
    speculative_config: str = ""
    # Requests allowed to wait for admission; beyond, new requests get RESOURCE_EXHAUSTED.
    max_waiting: int = 4096
    # Plan ahead while the executor runs: with depth d, steps N+1..N+d-1 are planned and sent
    # while step N runs (docs/scheduler.md, "Steps in flight"); overlap False = depth 1, strict
    # plan/wait/apply.
    overlap: bool = True
    pipeline_depth: int = 3
    # Tokens per streamed message (the last message may hold fewer); 1 = every step's token.
    # Larger values cut the per-message cost of many concurrent streams.
    stream_interval: int = 1
    # While the API process's event loop lags (api/stream_pacing.py), each stream writes at most
    # one message per pacing gap, which grows up to this many ms; 0 = never paced.
    stream_pacing_ms: float = 50.0
    # A client that stops reading its stream (docs/hardening.md, "Slow consumers"): once its RPC
    # has been stuck in one write (the client's transport window is full) for more than a
    # second with more than this many tokens a sample queued unread, or for more than
    # max_stream_stall seconds (0 = no time bound), the request is aborted (its slot and KV
    # blocks freed) and the stream ends RESOURCE_EXHAUSTED.
    max_stream_backlog: int = 256
    max_stream_stall: float = 5.0
    # Largest message between the scheduler's two processes (pickled bytes); a request or an
    # output above it fails alone with RESOURCE_EXHAUSTED.
    max_pipe_frame_bytes: int = 64 << 20
    # Seconds to wait for the executor at start.
    executor_connect_timeout: float = 300.0
    # Liveness of the executor (docs/hardening.md, "A hung executor"): a step whose result has
    # not come after this many seconds means the executor is hung; in-flight requests fail
    # with UNAVAILABLE and the scheduler reconnects.
    executor_step_timeout: float = 60.0
    # While idle, the executor is pinged this often (and must answer within the same time).
    executor_health_interval: float = 5.0
    # Secret sent on every executor RPC ("authorization: Bearer <token>"); the executor
    # refuses calls without its token. Also from LLMSERVE_INTERNAL_TOKEN. Kept out of repr.
    internal_token: str = field(default="", repr=False)
    # Prometheus metrics HTTP port; 0 = off.
    metrics_port: int = 0
    # OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, ...) on --host, in
    # the same process and on the same engine as the gRPC API; 0 = off.
    http_port: int = 0
    # GET /tokenizer_info on the HTTP API (vLLM's flag: it shows the chat template and the
    # tokenizer's configuration); off = 404.
    enable_tokenizer_info_endpoint: bool = False
    # Tool calling on /v1/chat/completions (vLLM's flags; docs/api.md, "Tool calling"): parse
    # the model's calls for tool_choice "auto" (the default with tools), in the format of
    # tool_call_parser (TOOL_CALL_PARSERS; also the format that describes the tools to a chat
    # template that does not render them; "" = hermes there, and "auto" is refused).
    enable_auto_tool_choice: bool = False
    tool_call_parser: str = ""
    # Public API limits, checked before any work (docs/hardening.md, "API limits"): UTF-8 bytes
    # of a text prompt or of all chat messages' roles and contents, chat messages per request,
    # stop strings per request and their total bytes, stop token ids per request. The public
    # server's gRPC max receive message length is derived from these.
    max_prompt_bytes: int = 4 << 20
    max_chat_messages: int = 1024
    max_stop_strings: int = 16
    max_stop_bytes: int = 4096
    max_stop_token_ids: int = MAX_STOP_TOKEN_IDS
    # Most parallel samples (n) of one request (OpenAI's limit; vLLM has none). All n must fit
    # in the KV cache at once (they share the prompt's blocks).
    max_n: int = 128
    # Responses the HTTP API keeps for previous_response_id and GET /v1/responses/{id}, in
    # memory (docs/api.md, "Responses API"): at most this many and this many bytes, the least
    # recently used dropped first; 0 = none kept (every response says "store": false).
    responses_store_max_entries: int = 1024
    responses_store_max_bytes: int = 64 << 20
    # Threads that tokenize, render chat templates and decode off the event loop (vLLM's old
    # --tokenizer-pool-size); at least 1.
    tokenizer_pool_size: int = 2
    # TLS on the public API (vLLM's names): certificate chain and private key (PEM); with a CA
    # bundle, clients must present a certificate it signed (mutual TLS). Empty = plaintext.
    ssl_certfile: str = ""
    ssl_keyfile: str = ""
    ssl_ca_certs: str = ""
    # Bearer token every public RPC but grpc.health.v1 needs ("authorization: Bearer <key>");
    # empty = open. Also from LLMSERVE_API_KEY (as vLLM reads VLLM_API_KEY). Kept out of repr.
    api_key: str = field(default="", repr=False)
    log_level: str = "INFO"
    # Seconds between the engine core's stats lines (throughput, load, KV usage); 0 = off.
    log_stats_interval: float = 10.0
    # The access log: one line per request on both doors (api/access_log.py; docs/metrics.md,
    # "Logs"), on by default; True (vLLM's --disable-log-requests) keeps only failures' lines.
    disable_log_requests: bool = False


# --tool-call-parser's formats (scheduler_svc/api/tools/plan.py FORMATS, one module each)
TOOL_CALL_PARSERS = ("hermes", "llama3_json")
_env = partial(env_default, "LLMSERVE_SCHEDULER_")  # LLMSERVE_SCHEDULER_<FLAG> as the default's type


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
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=_env("ENABLE_PREFIX_CACHING", d.enable_prefix_caching),
                   help="reuse the KV blocks of a prompt prefix already computed "
                        "(default on; --no-enable-prefix-caching turns it off)")
    p.add_argument("--speculative-config", type=scheduler_flag,
                   default=_env("SPECULATIVE_CONFIG", d.speculative_config),
                   help="speculative decoding as vLLM's JSON, e.g. '{\"method\": \"ngram\", "
                        "\"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4, "
                        "\"prompt_lookup_min\": 2}' (n-gram prompt lookup) or '{\"model\": \"/draft\", "
                        "\"num_speculative_tokens\": 4}' (draft model: the executor must have it "
                        "too); default off")
    p.add_argument("--max-waiting", type=int, default=_env("MAX_WAITING", d.max_waiting))
    p.add_argument("--no-overlap", dest="overlap", action="store_false",
                   default=_env("OVERLAP", d.overlap),
                   help="wait for each step's result before planning the next")
    p.add_argument("--pipeline-depth", type=_depth, default=_env("PIPELINE_DEPTH", d.pipeline_depth),
                   help="steps kept in flight at the executor (1-8): 2 plans step N+1 while N "
                        "runs, 3 also N+2, which hides the scheduler/executor round trip when a "
                        "step is shorter than it; a request that stops runs up to depth-1 "
                        "extra steps whose tokens are dropped")
    p.add_argument("--stream-interval", type=int, default=_env("STREAM_INTERVAL", d.stream_interval),
                   help="tokens per streamed message: every message but the last carries at least "
                        "this many (more when the client falls behind and queued tokens fold into "
                        "one message); 1 = every token as soon as it is sampled")
    p.add_argument("--stream-pacing-ms", type=float, default=_env("STREAM_PACING_MS", d.stream_pacing_ms),
                   help="while this process falls behind its streams (its event loop lags over "
                        "1 ms), each stream writes at most one message per pacing gap, which "
                        "grows up to this many ms; the tokens in between fold into the next "
                        "message (the last is never held); 0 = every token written as it comes")
    p.add_argument("--max-stream-backlog", type=int,
                   default=_env("MAX_STREAM_BACKLOG", d.max_stream_backlog),
                   help="tokens a stream may hold unread (a sample, once its writes have been "
                        "stuck for 1 s) before its request is aborted (RESOURCE_EXHAUSTED: the "
                        "client read too slowly)")
    p.add_argument("--max-stream-stall", type=float,
                   default=_env("MAX_STREAM_STALL", d.max_stream_stall),
                   help="seconds a stream's write may stay stuck (its client reads nothing) before "
                        "its request is aborted, whatever its backlog; 0 = no time bound")
    p.add_argument("--max-pipe-frame-bytes", type=int,
                   default=_env("MAX_PIPE_FRAME_BYTES", d.max_pipe_frame_bytes),
                   help="largest message between the scheduler's two processes")
    p.add_argument("--executor-connect-timeout", type=float,
                   default=_env("EXECUTOR_CONNECT_TIMEOUT", d.executor_connect_timeout),
                   help="seconds to wait for the executor at start")
    p.add_argument("--executor-step-timeout", type=float,
                   default=_env("EXECUTOR_STEP_TIMEOUT", d.executor_step_timeout),
                   help="seconds without a step result before the executor counts as hung "
                        "(in-flight requests fail with UNAVAILABLE, health turns NOT_SERVING)")
    p.add_argument("--executor-health-interval", type=float,
                   default=_env("EXECUTOR_HEALTH_INTERVAL", d.executor_health_interval),
                   help="seconds between liveness pings of an idle executor (also their deadline)")
    p.add_argument("--internal-token",
                   default=_env("INTERNAL_TOKEN", os.environ.get("LLMSERVE_INTERNAL_TOKEN", d.internal_token)),
                   help="secret the executor requires on its API (prefer the LLMSERVE_INTERNAL_TOKEN "
                        "environment variable: flags show in ps)")
    p.add_argument("--internal-token-file",
                   default=_env("INTERNAL_TOKEN_FILE", os.environ.get("LLMSERVE_INTERNAL_TOKEN_FILE", "")),
                   help="file holding the internal token, read at start when none is given directly "
                        "(also LLMSERVE_INTERNAL_TOKEN_FILE; docker-compose.yml's init service writes one)")
    p.add_argument("--metrics-port", type=int, default=_env("METRICS_PORT", d.metrics_port))
    p.add_argument("--http-port", type=int, default=_env("HTTP_PORT", d.http_port),
                   help="serve the OpenAI-compatible HTTP API on this port too (0 = off)")
    p.add_argument("--enable-tokenizer-info-endpoint", action="store_true",
                   default=_env("ENABLE_TOKENIZER_INFO_ENDPOINT", d.enable_tokenizer_info_endpoint),
                   help="serve GET /tokenizer_info on the HTTP API (vLLM's: the tokenizer's "
                        "configuration and chat template, for clients such as lm-eval)")
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   default=_env("ENABLE_AUTO_TOOL_CHOICE", d.enable_auto_tool_choice),
                   help='parse tool calls from the output for tool_choice "auto" (needs --tool-call-parser)')
    p.add_argument("--tool-call-parser", type=_tool_call_parser,
                   default=_env("TOOL_CALL_PARSER", d.tool_call_parser),
                   help=f"format of the model's tool calls: {', '.join(TOOL_CALL_PARSERS)}")
    _add_api_boundary_flags(p, d)
    p.add_argument("--log-level", default=_env("LOG_LEVEL", d.log_level))
    p.add_argument("--log-stats-interval", type=float,
                   default=_env("LOG_STATS_INTERVAL", d.log_stats_interval),
                   help="seconds between the engine core's stats lines (only after activity); 0 = off")
    p.add_argument("--disable-log-requests", action="store_true",  # (or the old LOG_REQUESTS=0)
                   default=_env("DISABLE_LOG_REQUESTS",
                                not _env("LOG_REQUESTS", not d.disable_log_requests)),
                   help="no access-log line per request (failures are still logged, with their "
                        "error id); default: one line per request on both APIs")
    # Deprecated (the per-request line was off by default): --log-requests is now the default,
    # --no-log-requests = --disable-log-requests.
    p.add_argument("--log-requests", dest="disable_log_requests", action="store_false",
                   default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.add_argument("--no-log-requests", dest="disable_log_requests", action="store_true",
                   default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return p


def _add_api_boundary_flags(p: argparse.ArgumentParser, d: SchedulerConfig) -> None:
    """Limits, tokenizer pool, TLS and the API key of the public API (docs/hardening.md)."""
    for name, help_text in [
        ("max_prompt_bytes", "most UTF-8 bytes of a text prompt or of all chat messages"),
        ("max_chat_messages", "most chat messages in one request"),
        ("max_stop_strings", "most stop strings in one request"),
        ("max_stop_bytes", "most UTF-8 bytes of one request's stop strings together"),
        ("max_stop_token_ids", "most stop token ids in one request"),
        ("max_n", "most parallel samples (n) of one request"),
        ("tokenizer_pool_size", "threads that tokenize off the event loop (at least 1)"),
        ("responses_store_max_entries", "most responses kept for previous_response_id (0 = none)"),
        ("responses_store_max_bytes", "most bytes of the responses kept (0 = none)"),
    ]:
        p.add_argument("--" + name.replace("_", "-"), type=int,
                       default=_env(name.upper(), getattr(d, name)), help=help_text)
    p.add_argument("--ssl-certfile", default=_env("SSL_CERTFILE", d.ssl_certfile),
                   help="PEM certificate chain: serve the public API over TLS")
    p.add_argument("--ssl-keyfile", default=_env("SSL_KEYFILE", d.ssl_keyfile),
                   help="PEM private key of --ssl-certfile")
    p.add_argument("--ssl-ca-certs", default=_env("SSL_CA_CERTS", d.ssl_ca_certs),
                   help="PEM CA bundle: require client certificates signed by it (mutual TLS)")
    p.add_argument("--api-key", default=_env("API_KEY", os.environ.get("LLMSERVE_API_KEY", d.api_key)),
                   help="require 'authorization: Bearer <key>' on every RPC but health "
                        "(prefer the LLMSERVE_API_KEY environment variable: flags show in ps)")


def _tool_call_parser(text: str) -> str:
    if text and text not in TOOL_CALL_PARSERS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(TOOL_CALL_PARSERS)}, got {text!r}")
    return text


def _depth(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 8:
        raise argparse.ArgumentTypeError(f"must be 1..8, got {value}")
    return value


def from_args(argv: list[str] | None = None) -> SchedulerConfig:
    """Parses flags (environment variables LLMSERVE_SCHEDULER_<FLAG> give the defaults)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 0 <= args.stream_pacing_ms <= 1000:
        parser.error(f"--stream-pacing-ms must be in [0, 1000], got {args.stream_pacing_ms:g}")
    for name in ("responses_store_max_entries", "responses_store_max_bytes"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0 (0 = no responses kept)")
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        parser.error("--enable-auto-tool-choice needs --tool-call-parser "
                     f"({' or '.join(TOOL_CALL_PARSERS)})")
    values = vars(args)
    values["internal_token"] = token_or_file(values["internal_token"], values.pop("internal_token_file"))
    return SchedulerConfig(**values)
