"""TensorParallelRunner: the ModelRunner of one rank. Rank 0 is the one the servicer drives:
before each launch / reset it sends the plan to the other ranks (PlanChannel), which run the
same launch on their shard (serve_plans), so every collective of the forward is met on every
rank in the same order. Rank 0 checks and applies each plan before it sends it, and sends
the plan that runs (rows that failed alone dropped), so every rank runs the same rows.
Sampling runs once, on rank 0; its ids (the rows' last tokens, the
next step's decode inputs) are broadcast on the device group, with no host sync.

Speculative decoding: every rank computes a verify step's draft logits (an all-gather); rank 0
alone decides (rejection sampling) and the rows' last tokens are broadcast after it (one
broadcast for the step, in place of the sampler's). The rejected drafts' slots are given back
at a launch: rank 0 applies what its finished verify steps registered (Rollbacks) and sends
the (row, slots) it applied with that plan, which the other ranks apply before the same launch,
so every rank's rows hold the same computed counts at every step."""

from __future__ import annotations

import logging
import threading

import numpy as np

from executor_svc.parallel.channel import LAUNCH, RESET, STOP, USE_GRAPHS, PlanChannel
from executor_svc.parallel.state import TensorParallel
from executor_svc.spec_decode.verify import verify
from executor_svc.worker.model_runner import ModelRunner, StepHandle
from executor_svc.worker.plan_apply import Admitted, admit
from protos.llmserve.executor.v1 import executor_pb2 as pb
from step_protocol import codec
from step_protocol.domain import StepPlan

log = logging.getLogger(__name__)


class TensorParallelRunner(ModelRunner):
    """A ModelRunner over this rank's shard (tp, channel set by attach())."""

    tp: TensorParallel
    channel: PlanChannel
    workers = None  # rank 0: the other ranks' processes (launch.Workers), or None (tests)

    def attach(self, tp: TensorParallel, workers=None) -> TensorParallelRunner:
        self.tp, self.channel, self.workers = tp, PlanChannel(tp), workers
        self._lock = threading.Lock()  # rank 0: a command and its step's collectives go together
        self._closed = False
        self._verifying = False  # the step being launched has verify rows (its broadcast is _verify's)
        return self

    def launch(self, plan: StepPlan, arrived: float | None = None,
               rollbacks: np.ndarray | None = None) -> StepHandle:
        """rollbacks (ranks 1..): [R, 2] (row, slots) rank 0 gave back before this plan."""
        if self.tp.rank != 0:
            for row, n in (rollbacks if rollbacks is not None else ()):
                self.batch.num_computed[int(row)] -= int(n)
            return super().launch(plan, arrived)
        with self._lock:
            return super().launch(plan, arrived)

    def _update_states(self, plan: StepPlan) -> Admitted:
        """Rank 0 decides which rows run: it checks and applies the plan first, then sends the
        plan that runs (its failed rows dropped, a failed cached row finished) with the
        rollbacks it applied, before any collective. A plan it refuses goes out empty (the
        other ranks give back the same slots, and run nothing). Ranks 1.. apply what rank 0
        ran; a row failing on them alone would leave the ranks out of step: that ends them."""
        if self.tp.rank != 0:
            admitted = admit(plan, self.batch, self._info)
            if admitted.failed:
                raise RuntimeError(f"rank {self.tp.rank}: rows rank 0 ran failed here: {admitted.failed[:4]}")
        else:
            applied = np.asarray(self._rollbacks.apply(self.batch), dtype=np.int64).reshape(-1, 2)
            try:
                admitted = admit(plan, self.batch, self._info)
            except BaseException:
                self._send_plan(StepPlan(plan.step_id), applied)
                raise
            self._send_plan(admitted.plan, applied)
        self._verifying = admitted.scheduled.drafts is not None  # = a verify step (_verify broadcasts)
        return admitted

    def _send_plan(self, plan: StepPlan, rollbacks: np.ndarray) -> None:
        encoded = codec.plan_to_pb(plan).SerializeToString()
        self.channel.send(LAUNCH, encoded + rollbacks.tobytes(), arg=len(encoded))

    def _apply_rollbacks(self) -> None:
        """Rank 0 applied them in launch() (and sent them); ranks 1.. have none of their own."""

    def reset(self) -> None:
        if self.tp.rank != 0:
            return super().reset()
        with self._lock:
            self.channel.send(RESET)
            super().reset()

    def use_graphs(self, enabled: bool) -> None:
        if self.tp.rank == 0:
            with self._lock:
                self.channel.send(USE_GRAPHS, arg=int(enabled))
        super().use_graphs(enabled)

    def _sample(self, step, *args, **kwargs):
        """Rank 0 samples; every rank then holds rank 0's ids as the rows' last tokens."""
        pending = super()._sample(step, *args, **kwargs) if self.tp.rank == 0 else None
        if not self._verifying:  # else after the verify rows' tokens are picked (_verify)
            self.tp.broadcast(self.batch.last_sampled_gpu)
        return pending

    def _verify(self, spec, hidden):
        """Every rank's share of the draft logits (all-gathered); rank 0 picks the tokens, then
        every rank holds rank 0's last tokens. Ranks 1.. answer nothing (None: no rollback of
        their own; rank 0 sends its rollbacks with the next plans)."""
        logits = self.model.compute_logits(hidden[spec.token_index])
        if self.tp.rank == 0:
            verify(spec, logits, self.batch.last_sampled_gpu, self.batch.chain_ok_gpu)
        self.tp.broadcast(self.batch.last_sampled_gpu)
        return spec if self.tp.rank == 0 else None

    def watch(self, on_failure) -> None:
        """on_failure(reason) once, from a watchdog thread, when another rank dies."""
        if self.workers is not None:
            self.workers.watch(on_failure)

    def close(self, timeout: float = 10.0) -> None:
        """Rank 0: stops the other ranks (STOP, then waits for their exit; kills what is left)."""
        if self.tp.rank != 0 or self._closed:
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


def serve_plans(runner: TensorParallelRunner) -> None:
    """Ranks 1..: runs what rank 0 sends until STOP: only plans rank 0 accepted, its failed
    rows already dropped (a plan it refused comes empty). Any error ends the rank (its
    collectives may no longer match rank 0's), which ends the service (launch.Workers)."""
    while True:
        op, payload, arg = runner.channel.receive()
        if op == STOP:
            runner.reset()
            return
        try:
            if op == LAUNCH:  # the plan's arg bytes, then the rollbacks rank 0 applied before it
                rollbacks = np.frombuffer(payload[arg:], dtype=np.int64).reshape(-1, 2)
                runner.launch(codec.plan_from_pb(pb.StepPlan.FromString(payload[:arg])), rollbacks=rollbacks)
            elif op == RESET:
                runner.reset()
            elif op == USE_GRAPHS:
                runner.use_graphs(bool(arg))
        except Exception:  # its collectives may be out of step with rank 0's now: give up
            log.exception("rank %d: command %d failed; exiting", runner.tp.rank, op)
            raise
