"""`llmserve`: starts the executor and the scheduler on one machine; Ctrl-C stops both.

Each service is its own process (as in a split deployment); this only wires their addresses
together and supervises them: when one exits, the other is stopped too. SIGTERM or Ctrl-C
stops both and exits 0; the services never outlive the launcher (on Linux the kernel sends
them SIGTERM if it dies, even by SIGKILL). Its flags and the command lines and environments
they become: llmserve/flags.py.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time

from llmserve.flags import (  # noqa: F401 (imported from here by tests and benchmarks)
    TOKEN_ENV,
    build_parser,
    commands,
    environments,
    parse_args,
    security_hint,
    services_env,
)
from llmserve.lifetime import die_with_parent

STOP_TIMEOUT_S = 15.0  # for both services to drain and exit before they are killed
NAMES = ("executor", "scheduler")  # in the order of flags.commands()


def _say(line: str) -> None:
    """One line on stderr (the services log there too): why the launcher stops, with the codes."""
    print(f"llmserve: {line}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Runs both services until one exits (returns its exit code, or 1) or until SIGINT/SIGTERM
    (stops both, returns 0)."""
    stopping = None  # the signal's name once one asked us to stop

    def stop(signum, _frame):
        nonlocal stopping
        stopping = signal.Signals(signum).name

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    args = parse_args(argv)
    hint = security_hint(args, os.environ)
    if hint:
        print(hint, file=sys.stderr, flush=True)
    launcher_pid = os.getpid()
    # the executor serves only the holder of this token: LLMSERVE_INTERNAL_TOKEN, else a fresh one
    envs = environments(args, os.environ, os.environ.get(TOKEN_ENV[0]) or secrets.token_urlsafe(32))
    # preexec_fn is safe here: the launcher has no threads.
    procs = [subprocess.Popen(cmd, env=env, preexec_fn=lambda: die_with_parent(signal.SIGTERM, launcher_pid))
             for cmd, env in zip(commands(args), envs)]
    while not stopping and all(p.poll() is None for p in procs):
        time.sleep(0.1)
    if stopping:
        code = 0
        _say(f"stopping both services ({stopping})")
    else:
        name, returncode = next((n, p.returncode) for n, p in zip(NAMES, procs) if p.poll() is not None)
        code = _exit_code(returncode)
        others = [n for n, p in zip(NAMES, procs) if p.poll() is None]
        _say(f"the {name} exited with code {returncode}" +
             (f"; stopping the {' and the '.join(others)}" if others else ""))
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for name, p in zip(NAMES, procs):
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _say(f"the {name} did not stop within {STOP_TIMEOUT_S:.0f} s; killing it")
            p.kill()
            p.wait()
    _say(f"exiting with code {code} (executor {procs[0].returncode}, scheduler {procs[1].returncode})")
    return code


def _exit_code(returncode: int) -> int:
    """A service that stopped by itself: its failure code (128 + signal when killed by one);
    one that exited 0 unasked still stopped the server, so 1."""
    if returncode < 0:
        return 128 - returncode
    return returncode or 1


if __name__ == "__main__":
    sys.exit(main())
