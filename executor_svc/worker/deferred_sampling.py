"""A constrained step's masked sampling, enqueued after the launch that enqueued its forward.

Why: a grammar's mask for step N needs the tokens sampled at step N-1 on the host (the matchers
consume them first), and the scheduler has planned N before it saw them. Waiting for them inside
N's launch made the launch thread wait for the device, so the host lost its lead and its whole
per-step work sat on the critical path (docs/benchmarks.md, Runs R). Instead N's launch enqueues
its forward and returns; N's sampling (masks filled on the host, the bit test in the sampling
kernel) is enqueued by whichever comes first:

- the next launch, first thing, before its plan changes any row (the rows' sampling state and
  the sampler's host set are still step N's); N-1's tokens were sampled before N's forward
  started, so the matchers' catch-up does not wait while the device has N's forward to run;
- N's finish, once N's forward has run on the device, when no launch came (the last step, a
  scheduler without overlap); it waits for a launch that holds the lock instead, since that
  launch enqueues N first.

One lock (the runner's launch holds it whole) keeps the two apart; a step is flushed once. Only
with one rank: another rank's broadcast of the last tokens stays inside the launch's guard.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from executor_svc.sample.inputs import SampleStep
from executor_svc.sample.sampler import Sampler


class DeferredSampling:
    """The step whose sampling waits (at most one: the next launch flushes it). take_failures(out):
    the runner's, adding the grammar failures the masks found to a step's result."""

    def __init__(self, sampler: Sampler, take_failures: Callable):
        self.sampler, self._take_failures = sampler, take_failures
        self.lock = threading.RLock()  # held by every launch, and by a finish that flushes
        self._handle = None  # model_runner.StepHandle

    def defer(self, handle, logits: torch.Tensor, sampling: SampleStep, graph_size: int) -> None:
        """Keeps a launched step's sampling for later (under self.lock: in its launch)."""
        handle.deferred = (logits, sampling, graph_size)
        handle.flushed = threading.Event()
        self._handle = handle

    def flush(self) -> None:
        """Enqueues the waiting step's sampling, if any (under self.lock). The step's timer
        marks: [..., forward end, this, completion]."""
        handle, self._handle = self._handle, None
        if handle is None:
            return
        logits, sampling, graph_size = handle.deferred
        handle.timer.mark()
        handle.sampled = self.sampler.sample(logits, sampling, graph_size)  # (one rank: nothing to share)
        self._take_failures(handle.out)
        handle.timer.mark()  # the step's completion event
        handle.deferred = None
        handle.flushed.set()

    def wait(self, handle) -> None:
        """In the step's finish, before it waits for the step's completion: its sampling is
        enqueued, by a launch or here."""
        handle.timer.wait()  # its forward has run (CUDA: releases the GIL); no lock held
        while not handle.flushed.is_set():
            if self.lock.acquire(blocking=False):
                try:
                    with torch.inference_mode():  # as a launch runs it
                        if self._handle is handle:
                            self.flush()
                finally:
                    self.lock.release()
            else:  # a launch holds it: it enqueues this step first thing
                handle.flushed.wait(0.0005)

    def clear(self) -> None:
        self._handle = None
