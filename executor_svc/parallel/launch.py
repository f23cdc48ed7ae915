"""Rank 0's side of start-up: check that the model splits, start ranks 1..N-1
(`python -m executor_svc.parallel.worker`, one process each), join the process group with
them, build this rank's runner, and watch the others: a rank that exits while serving ends
the service (on_failure), one that exits during start-up ends this process."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta

import torch

from executor_svc.config import ENV_PREFIX, SHARED_TOKEN_ENV, ExecutorConfig
from executor_svc.parallel.state import ParallelError, TensorParallel

log = logging.getLogger(__name__)
SPEC_ENV = "LLMSERVE_TP_WORKER"  # the worker's rank, world size, port and config (JSON)
COLLECTIVE_TIMEOUT_S = 300  # the forward's collectives: a rank that stops answering fails the step
IDLE_TIMEOUT = timedelta(days=30)  # plans: ranks 1.. wait for the next one as long as the service is idle
TOKEN_ENV = (SHARED_TOKEN_ENV, ENV_PREFIX + "INTERNAL_TOKEN")  # not passed on: the ranks serve nothing
EXIT_GRACE_S = 15.0  # after a rank died: the service's time to stop before this process exits


def init_group(rank: int, size: int, port: int, device: str) -> TensorParallel:
    """Joins the process group (NCCL on CUDA, gloo on CPU; rendezvous on 127.0.0.1:port) and,
    on CUDA, selects device `rank`. Plans and start-up sums go through a gloo group of their own."""
    import torch.distributed as dist

    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    cpu_group = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    return TensorParallel(rank, size, dist.group.WORLD, cpu_group)


def check_splits(config: ExecutorConfig, folder) -> None:
    """ModelError (one line) before any rank starts, for what every rank would refuse: the
    folder, --max-model-len, too few GPUs, a shape (or an FP8 checkpoint's blocks) that does not split
    over the ranks."""
    from executor_svc.model_loader import checks as model_checks, safetensors as loader
    from executor_svc.model_loader.checks import ModelError
    from executor_svc.models.llama import ModelArgs
    from executor_svc.parallel import shard_fp8
    from executor_svc.quantization import schemes

    size = config.tensor_parallel_size
    cfg = loader.load_hf_config(folder)
    model_checks.served_max_model_len(cfg, config.max_model_len)
    scheme = schemes.weight_scheme(cfg, config.quantization)
    if config.device.startswith("cuda") and torch.cuda.device_count() < size:
        raise ModelError(f"--tensor-parallel-size {size} needs {size} GPUs, {torch.cuda.device_count()} visible")
    try:
        args = ModelArgs.from_hf_config(cfg)
        TensorParallel(0, size).rank_args(args)
        if scheme is not None and scheme.strategy == "block":  # every rank's shard on block boundaries
            for rank in range(size):
                shard_fp8.check_blocks(args, TensorParallel(rank, size), scheme.block)
    except ParallelError as e:
        raise ModelError(str(e)) from None


def build_parallel_runner(config: ExecutorConfig):
    """Rank 0's ModelRunner, its ranks TensorParallelRanks over ranks 1..N-1, started here
    (runner.close() stops them). The model folder is resolved once here (a GGUF file converted once)."""
    from executor_svc.model_loader import source as model_source
    from executor_svc.startup.build import build_runner
    from executor_svc.startup.warmup import warm_up

    source = model_source.resolve(config.model, model_source.cache_dir(config.cache_dir), getattr(torch, config.dtype))
    config = dataclasses.replace(config, model=str(source.folder), model_name=config.model_name or source.name)
    check_splits(config, source.folder)
    port = _free_port()
    workers = Workers.start(config, port)
    try:
        tp = init_group(0, config.tensor_parallel_size, port, config.device)
        runner = build_runner(config, tp, workers)
        warm_up(runner)  # every rank runs its plans: they serve them now (parallel/ranks.py)
    except BaseException:
        workers.stop(0)
        raise
    log.info("tensor parallel: %d ranks, KV blocks %d (the fewest of any rank)", tp.size, runner.info().num_blocks)
    return runner


class Workers:
    """Ranks 1..N-1 as child processes, and the thread that watches them."""

    def __init__(self, procs: list[subprocess.Popen]):
        self.procs, self._stopping = procs, False
        self._on_failure = None  # None: a death ends this process (start-up)
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, name="tp-watchdog", daemon=True).start()

    @classmethod
    def start(cls, config: ExecutorConfig, port: int) -> Workers:
        fields = dataclasses.asdict(dataclasses.replace(config, internal_token=""))  # they serve nothing
        procs = []
        for rank in range(1, config.tensor_parallel_size):
            spec = {"rank": rank, "size": config.tensor_parallel_size, "port": port, "parent": os.getpid(),
                    "config": fields}
            env = {k: v for k, v in os.environ.items() if k not in TOKEN_ENV}
            env[SPEC_ENV] = json.dumps(spec)
            procs.append(subprocess.Popen([sys.executable, "-m", "executor_svc.parallel.worker"], env=env,
                                          stdin=subprocess.DEVNULL))
        return cls(procs)

    def expect_exit(self) -> None:
        """The ranks are being stopped: their exit is no failure."""
        self._stopping = True

    def all_alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def watch(self, on_failure) -> None:
        """From now on a rank's death calls on_failure(reason) once (then exits after a grace)."""
        with self._lock:
            self._on_failure = on_failure

    def stop(self, timeout: float) -> None:
        """Waits up to `timeout` s for every rank to exit (after STOP), then kills what is left."""
        self.expect_exit()
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def _watch(self) -> None:
        while not self._stopping:
            for rank, p in enumerate(self.procs, start=1):
                if p.poll() is not None and not self._stopping:
                    return self._died(rank, p.returncode)
            time.sleep(0.1)

    def _died(self, rank: int, code: int) -> None:
        reason = f"tensor-parallel rank {rank} exited with status {code}"
        log.error("%s: stopping every rank", reason)
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        with self._lock:
            on_failure = self._on_failure
        if on_failure is not None:
            on_failure(reason)
            time.sleep(EXIT_GRACE_S)  # the service stops by itself; this exit is the backstop
        logging.shutdown()
        print(f"llmserve-executor: error: {reason}", file=sys.stderr, flush=True)
        os._exit(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
