"""TensorParallelRanks: how a step meets the other ranks (worker/ranks.py's interface). Rank 0
is the one the servicer drives: before each launch / reset it sends the plan to the other
ranks (PlanChannel), which run the same launch on their shard (serve_plans), so every
collective of the forward is met on every rank in the same order. Rank 0 checks and applies
each plan before it sends it, and sends the plan that runs (rows that failed alone dropped),
so every rank runs the same rows. Sampling runs once, on rank 0 (`decides`); its ids (the
rows' last tokens, the next step's decode inputs) are broadcast on the device group, with no
host sync.

Speculative decoding: every rank computes a verify step's draft logits (an all-gather); rank 0
alone decides (rejection sampling) and the rows' last tokens are broadcast after it (one
broadcast for the step, in place of the sampler's). The rejected drafts' slots are given back
at a launch: rank 0 applies what its finished verify steps registered (Rollbacks) and sends
the (row, slots) it applied with that plan, which the other ranks apply before the same launch,
so every rank's rows hold the same computed counts at every step."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import numpy as np
import torch

from executor_svc.parallel.channel import LAUNCH, RESET, STOP, USE_GRAPHS, PlanChannel
from executor_svc.parallel.state import TensorParallel
from executor_svc.worker.plan_apply import Admitted
from protos.llmserve.executor.v1 import executor_pb2 as pb
from step_protocol import codec
from step_protocol.domain import StepPlan

log = logging.getLogger(__name__)


class TensorParallelRanks:
    """This rank's side of the group. workers (rank 0): the other ranks' processes
    (launch.Workers), or None (tests that run the ranks as threads)."""

    def __init__(self, tp: TensorParallel, workers=None):
        self.tp, self.channel, self.workers = tp, PlanChannel(tp), workers
        self.decides = tp.rank == 0
        self.alone = False  # a step's broadcast of its last tokens stays inside its launch's guard
        self._lock = threading.Lock()  # rank 0: a command and its step's collectives go together
        self._closed = False
        self.received: np.ndarray | None = None  # ranks 1..: [R, 2] (row, slots) rank 0 gave back

    def guard(self) -> AbstractContextManager:
        return self._lock if self.decides else nullcontext()

    def admit(self, plan: StepPlan, own: list[tuple[int, int]],
              apply: Callable[[StepPlan, list[tuple[int, int]]], Admitted]) -> Admitted:
        """Rank 0 decides which rows run: it gives back its own rollbacks, checks and applies
        the plan (apply), then sends the plan that runs (its failed rows dropped) with the
        rollbacks it gave back, before any collective. A plan it refuses goes out empty (the
        other ranks give back the same slots, and run nothing). Ranks 1.. give back and apply
        what rank 0 did (self.received, set by serve_plans); a row failing on them alone
        would leave the ranks out of step: that ends them."""
        if not self.decides:
            received, self.received = self.received, None
            admitted = apply(plan, [] if received is None else [(int(r), int(n)) for r, n in received])
            if admitted.failed:
                raise RuntimeError(f"rank {self.tp.rank}: rows rank 0 ran failed here: {admitted.failed[:4]}")
        else:
            given = np.asarray(own, dtype=np.int64).reshape(-1, 2)
            try:
                admitted = apply(plan, own)
            except BaseException:
                self._send_plan(StepPlan(plan.step_id), given)
                raise
            self._send_plan(admitted.plan, given)
        return admitted

    def _send_plan(self, plan: StepPlan, rollbacks: np.ndarray) -> None:
        encoded = codec.plan_to_pb(plan).SerializeToString()
        self.channel.send(LAUNCH, encoded + rollbacks.tobytes(), arg=len(encoded))

    def share_last_tokens(self, last_tokens: torch.Tensor) -> None:
        self.tp.broadcast(last_tokens)

    def reset(self) -> None:
        if self.decides:
            self.channel.send(RESET)

    def use_graphs(self, enabled: bool) -> None:
        if self.decides:
            self.channel.send(USE_GRAPHS, arg=int(enabled))

    def watch(self, on_failure: Callable[[str], None]) -> None:
        """on_failure(reason) once, from a watchdog thread, when another rank dies."""
        if self.workers is not None:
            self.workers.watch(on_failure)

    def close(self, timeout: float = 10.0) -> None:
        """Rank 0: stops the other ranks (STOP, then waits for their exit; kills what is left)."""
        if not self.decides or self._closed:
            return
        self._closed = True
        if self.workers is not None:
            self.workers.expect_exit()
        alive = self.workers is None or self.workers.all_alive()
        if alive and self._lock.acquire(timeout=timeout):
            try:
                self.channel.send(STOP)
            except RuntimeError as e:  # a rank went away meanwhile
                log.warning("could not stop the other ranks cleanly: %s", e)
            finally:
                self._lock.release()
        if self.workers is not None:
            self.workers.stop(timeout)


def serve_plans(runner) -> None:
    """Ranks 1..: runs what rank 0 sends (to the ModelRunner over this rank's shard, whose
    ranks are TensorParallelRanks) until STOP: only plans rank 0 accepted, its failed rows
    already dropped (a plan it refused comes empty). Any error ends the rank (its collectives
    may no longer match rank 0's), which ends the service (launch.Workers)."""
    ranks: TensorParallelRanks = runner.ranks
    while True:
        op, payload, arg = ranks.channel.receive()
        if op == STOP:
            runner.reset()
            return
        try:
            if op == LAUNCH:  # the plan's arg bytes, then the rollbacks rank 0 applied before it
                ranks.received = np.frombuffer(payload[arg:], dtype=np.int64).reshape(-1, 2)
                runner.launch(codec.plan_from_pb(pb.StepPlan.FromString(payload[:arg])))
            elif op == RESET:
                runner.reset()
            elif op == USE_GRAPHS:
                runner.use_graphs(bool(arg))
        except Exception:  # its collectives may be out of step with rank 0's now: give up
            log.exception("rank %d: command %d failed; exiting", ranks.tp.rank, op)
            raise
