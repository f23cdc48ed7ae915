"""`llmserve`: starts the executor and the scheduler on one machine; Ctrl-C stops both.

Each service is its own process (as in a split deployment); this only wires their addresses
together and supervises them: when one exits, the other is stopped too.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import subprocess
import sys
import time


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
    args = build_parser().parse_args(argv)
    procs = [subprocess.Popen(cmd) for cmd in commands(args)]
    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    code = 0
    while not stopping and all(p.poll() is None for p in procs):
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        elif p.returncode:
            code = p.returncode
    deadline = time.monotonic() + 15
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
    return code


if __name__ == "__main__":
    sys.exit(main())
