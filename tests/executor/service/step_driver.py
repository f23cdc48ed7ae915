"""StepThreads as the device process runs them (a launch thread, a finish thread, one link), with
the test as the endpoint's side of a socketpair."""

from __future__ import annotations

import socket
import threading
import time

from executor_svc.service import link
from executor_svc.service.step_threads import StepThreads
from protos.llmserve.executor.v1 import executor_pb2 as pb
from step_protocol import codec
from step_protocol.domain import StepPlan, StepResult

TIMEOUT_S = 30


class StepDriver:
    """with StepDriver(runner) as d: d.send(plan); d.result() ... (EOF at exit: the threads end)."""

    def __init__(self, runner):
        ours, theirs = socket.socketpair()
        ours.settimeout(TIMEOUT_S)  # a test that waits for a frame that never comes fails, not hangs
        self.peer = link.BlockingLink(ours)
        self.steps = StepThreads(runner, link.BlockingLink(theirs))  # its depth, as serve() makes it
        self.threads = [threading.Thread(target=self.steps.run_launches, name="executor-step", daemon=True),
                        threading.Thread(target=self.steps.run_finishes, name="executor-wait", daemon=True)]
        self._ended = False

    def __enter__(self) -> StepDriver:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def end(self) -> None:
        """End of file for the launch thread: it answers what it launched, then both threads end."""
        if not self._ended:
            self._ended = True
            self.peer._sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.end()
        for thread in self.threads:
            thread.join(TIMEOUT_S)
            assert not thread.is_alive(), f"{thread.name} did not end"
        self.peer.close()

    def send(self, plan: StepPlan | pb.StepPlan | bytes, epoch: int = 1, arrived_ns: int | None = None) -> None:
        if isinstance(plan, StepPlan):
            plan = codec.plan_to_pb(plan)
        body = plan if isinstance(plan, bytes) else plan.SerializeToString()
        assert self.peer.send(link.PLAN, epoch, body, time.monotonic_ns() if arrived_ns is None else arrived_ns)

    def reset(self, reset_id: int = 1) -> None:
        assert self.peer.send(link.RESET, reset_id)

    def frame(self) -> link.Frame:
        return self.peer.recv()

    def result(self) -> StepResult:
        frame = self.frame()
        assert frame.kind == link.RESULT, frame
        return codec.result_from_pb(pb.StepResult.FromString(frame.body))
