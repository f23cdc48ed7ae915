"""`llmserve`: starts the executor and the scheduler on one machine; Ctrl-C stops both.

Each service is its own process (as in a split deployment); this only wires their addresses
together and supervises them: when one exits, the other is stopped too. SIGTERM or Ctrl-C
stops both and exits 0; the services never outlive the launcher (on Linux the kernel sends
them SIGTERM if it dies, even by SIGKILL).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import signal
import subprocess
import sys
import time

from scheduler_svc.lifetime import die_with_parent

STOP_TIMEOUT_S = 15.0  # for both services to drain and exit before they are killed
# The internal token's variables: the shared one, then each service's own (which would win).
TOKEN_ENV = ("LLMSERVE_INTERNAL_TOKEN", "LLMSERVE_EXECUTOR_INTERNAL_TOKEN", "LLMSERVE_SCHEDULER_INTERNAL_TOKEN")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmserve", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="", help="Hugging Face model folder (default: the built-in demo model)")
    p.add_argument("--host", default="127.0.0.1", help="public API address (0.0.0.0 to expose)")
    p.add_argument("--port", type=int, default=50051, help="public API port")
    p.add_argument("--executor-port", type=int, default=50061, help="executor port (loopback only)")
    p.add_argument("--executor-args", default="", help="extra executor flags, e.g. '--enforce-eager'")
    p.add_argument("--scheduler-args", default="", help="extra scheduler flags, e.g. '--no-overlap'")
    return p


def commands(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    executor = [sys.executable, "-m", "executor_svc", "--host", "127.0.0.1",
                "--port", str(args.executor_port), *shlex.split(args.executor_args)]
    if args.model:
        executor += ["--model", args.model]
    scheduler = [sys.executable, "-m", "scheduler_svc", "--host", args.host, "--port", str(args.port),
                 "--executor-address", f"127.0.0.1:{args.executor_port}", *shlex.split(args.scheduler_args)]
    return executor, scheduler


def main(argv: list[str] | None = None) -> int:
    """Runs both services until one exits (returns its exit code, or 1) or until SIGINT/SIGTERM
    (stops both, returns 0)."""
    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    args = build_parser().parse_args(argv)
    hint = security_hint(args, os.environ)
    if hint:
        print(hint, file=sys.stderr, flush=True)
    launcher_pid = os.getpid()
    # the executor serves only the holder of this token: LLMSERVE_INTERNAL_TOKEN, else a fresh one
    env = services_env(os.environ, os.environ.get(TOKEN_ENV[0]) or secrets.token_urlsafe(32))
    # preexec_fn is safe here: the launcher has no threads.
    procs = [subprocess.Popen(cmd, env=env, preexec_fn=lambda: die_with_parent(signal.SIGTERM, launcher_pid))
             for cmd in commands(args)]
    while not stopping and all(p.poll() is None for p in procs):
        time.sleep(0.1)
    exited = [p for p in procs if p.poll() is not None]
    code = 0 if stopping else _exit_code(exited[0].returncode)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return code


def services_env(base, token: str) -> dict[str, str]:
    """`base` with `token` as both services' internal token. Passed in the environment, never
    in argv: a command line is visible to every local user (ps)."""
    env = {k: v for k, v in base.items() if k not in TOKEN_ENV}
    env[TOKEN_ENV[0]] = token
    return env


def _exit_code(returncode: int) -> int:
    """A service that stopped by itself: its failure code (128 + signal when killed by one);
    one that exited 0 unasked still stopped the server, so 1."""
    if returncode < 0:
        return 128 - returncode
    return returncode or 1


def security_hint(args: argparse.Namespace, environ) -> str:
    """One line saying how to turn on what is off: the API key and TLS of the public port
    (nothing secret is generated for it: the demo stays one command)."""
    scheduler_args = shlex.split(args.scheduler_args)
    has_key = "--api-key" in scheduler_args or any(
        environ.get(name) for name in ("LLMSERVE_API_KEY", "LLMSERVE_SCHEDULER_API_KEY"))
    has_tls = "--ssl-certfile" in scheduler_args or bool(environ.get("LLMSERVE_SCHEDULER_SSL_CERTFILE"))
    state, todo = [], []
    if not has_key:
        state.append("answers anyone who can reach it")
        todo.append("to require a key, start with LLMSERVE_API_KEY=<key> in the environment "
                    "(clients send 'authorization: Bearer <key>')")
    if not has_tls:
        state.append("is plaintext")
        todo.append("for TLS, add --scheduler-args '--ssl-certfile cert.pem --ssl-keyfile key.pem'")
    if not todo:
        return ""
    return f"llmserve: the API on {args.host}:{args.port} {' and '.join(state)}; " + "; ".join(todo)


if __name__ == "__main__":
    sys.exit(main())
