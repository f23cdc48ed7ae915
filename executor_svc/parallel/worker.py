"""Rank 1..N-1 of a tensor-parallel executor: `python -m executor_svc.parallel.worker`,
started by rank 0 (launch.py) with its spec in LLMSERVE_TP_WORKER. Joins the group, builds
its shard's runner (the same start-up as rank 0), then runs the plans rank 0 sends until
STOP. It exits when rank 0 does: its parent is checked every half second, and a collective
with a rank that is gone fails."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

from executor_svc.parallel.launch import SPEC_ENV
from llmserve.logs import configure_logging


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def main() -> None:
    spec = json.loads(os.environ[SPEC_ENV])
    rank, parent = spec["rank"], spec["parent"]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches every rank: rank 0 stops the others
    threading.Thread(target=_exit_with_parent, args=(parent,), name="parent-watch", daemon=True).start()
    configure_logging("INFO", "executor", f"rank {rank}")  # the one format (llmserve/logs.py)
    from executor_svc.config import ExecutorConfig
    from executor_svc.model_loader.checks import ModelError
    from executor_svc.parallel.launch import init_group
    from executor_svc.parallel.ranks import serve_plans
    from executor_svc.startup.build import build_runner

    fields = spec["config"]
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
    config = ExecutorConfig(**fields)
    tp = init_group(rank, spec["size"], spec["port"], config.device)
    try:
        runner = build_runner(config, tp)
    except ModelError as e:
        sys.exit(f"llmserve-executor rank {rank}: error: {e}")
    serve_plans(runner)
    import torch.distributed as dist

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
