"""The device process's step work: two Python threads, each with one job.

The launch thread reads the link's frames (link.py; a blocking recv, without the GIL). A plan
frame: it parses the plan (protobuf, then step_protocol's codec) and launches it on the runner
(runner.launch: enqueued on the device, no host sync), then hands the step to the finish thread.
At most `depth` launched steps are unanswered (HOST_SETS: the runner's host buffer sets, 3), so
plans N+1 and N+2 are launched while step N runs on the device, as soon as they have arrived and
step N-2 (N-1) is answered.
The finish thread waits for each step in launch order (runner.finish: its completion event, then
the sampled ids), serializes its result and sends it: results leave strictly in plan order. A plan
that fails to parse or launch answers with StepResult.error in its place, and the stream goes on.
A reset frame: the launch thread waits until every launched step is answered, runs
runner.reset(), and answers reset-done. At the link's end of file the launch thread waits for
every launched step's answer, then ends the finish thread, and returns.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from executor_svc.service import link
from executor_svc.worker.host_device import HOST_SETS
from executor_svc.worker.plan_checks import PlanError
from protos.llmserve.executor.v1 import executor_pb2 as pb
from step_protocol import codec
from step_protocol.domain import StepResult

log = logging.getLogger(__name__)
DEPTH = HOST_SETS  # launched steps unanswered at most: the runner's host buffer sets


class StepThreads:
    """run_launches() is the launch thread's loop, run_finishes() the finish thread's; the
    caller gives each its thread (the launch thread should be the one that built the runner)."""

    def __init__(self, runner, link_: link.BlockingLink, depth: int = DEPTH):
        self.runner, self.link, self.depth = runner, link_, depth
        self._unanswered = threading.Semaphore(depth)  # a permit per launched step until it is answered
        self._launched: queue.SimpleQueue = queue.SimpleQueue()  # (epoch, step id, handle or result)

    def run_launches(self) -> None:
        """Until the link ends (end of file: returns; a frame not of the protocol: LinkBroken)."""
        try:
            while True:
                try:
                    frame = self.link.recv()
                except EOFError:
                    return
                if frame.kind == link.PLAN:
                    self._launch(frame)
                elif frame.kind == link.RESET:
                    self._reset(frame.tag)
                else:
                    raise link.LinkBroken(f"unexpected frame kind {frame.kind!r} from the endpoint")
        finally:
            self._wait_answered()
            self._launched.put(None)

    def run_finishes(self) -> None:
        """Until the launch thread ends."""
        while (entry := self._launched.get()) is not None:
            epoch, step_id, step = entry
            self.link.send(link.RESULT, epoch, self._answer(step_id, step))
            self._unanswered.release()

    def _launch(self, frame: link.Frame) -> None:
        # the endpoint's arrival time (monotonic, one clock for every process of the host) on this
        # thread's perf_counter scale, as runner.launch takes it for queued_us
        arrived = time.perf_counter() - (time.monotonic_ns() - frame.stamp) / 1e9
        self._unanswered.acquire()
        step_id = 0
        try:
            msg = pb.StepPlan.FromString(frame.body)
            step_id = msg.step_id
            step = self.runner.launch(codec.plan_from_pb(msg), arrived)
        except Exception as exc:  # noqa: BLE001 - this plan's answer; the stream goes on
            step = failed(step_id, exc)
        self._launched.put((frame.tag, step_id, step))

    def _answer(self, step_id: int, step) -> bytes:
        """A launched step's result bytes (or those of its error)."""
        try:
            result = step if isinstance(step, StepResult) else self.runner.finish(step)
            return codec.result_to_pb(result).SerializeToString()
        except Exception as exc:  # noqa: BLE001 - this step's answer; the stream goes on
            return codec.result_to_pb(failed(step_id, exc)).SerializeToString()

    def _reset(self, reset_id: int) -> None:
        self._wait_answered()
        error = ""
        try:
            self.runner.reset()
        except Exception as exc:  # noqa: BLE001 - the Reset call's answer
            log.exception("reset failed")
            error = f"{type(exc).__name__}: {exc}"
        self.link.send(link.RESET_DONE, reset_id, error.encode())

    def _wait_answered(self) -> None:
        """Returns once every launched step is answered (no launch happens meanwhile: only
        this thread launches)."""
        for _ in range(self.depth):
            self._unanswered.acquire()
        for _ in range(self.depth):
            self._unanswered.release()


def failed(step_id: int, exc: BaseException) -> StepResult:
    """The result of a step whose plan was refused or whose launch or finish raised."""
    if isinstance(exc, PlanError):  # refused before anything changed: no traceback needed
        log.warning("step %d refused: %s", step_id, exc)
    else:
        log.error("step %d failed", step_id, exc_info=exc)
    return StepResult(step_id=step_id, error=f"{type(exc).__name__}: {exc}")
