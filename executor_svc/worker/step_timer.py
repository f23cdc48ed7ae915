"""The marks of one step: wall clock on CPU, CUDA events on GPU (model_runner.py's timings)."""

from __future__ import annotations

import time

import torch


class EventPool:
    """CUDA timing events made once and recorded again in turn: a step marks 3-5 of them, and
    making and destroying 4 events a step cost host time on the launch path. SIZE events last
    SIZE / 5 steps before one is recorded again, and an event is read at most two steps after
    its own (a step's finish, and the next step's idle time): the runner keeps at most two
    steps unfinished. (Events that sleep in synchronize(), cudaEventBlockingSync, were measured:
    no gain; docs/benchmarks.md, Runs V.)"""

    SIZE = 64

    def __init__(self):
        self._events = [torch.cuda.Event(enable_timing=True) for _ in range(self.SIZE)]
        self._next = 0

    def take(self) -> torch.cuda.Event:
        ev = self._events[self._next]
        self._next = (self._next + 1) % self.SIZE
        return ev


class StepTimer:
    """Wall-clock marks on CPU; CUDA events from `events` on GPU (the last one is the step's
    completion event), recorded on `stream` (the runner's, looked up once: current_stream()
    costs host time)."""

    def __init__(self, events: EventPool | None, stream: torch.cuda.Stream | None):
        self.cuda, self.stream, self.events = events is not None, stream, events
        self.marks = []

    def mark(self) -> None:
        if self.cuda:
            ev = self.events.take()
            ev.record(self.stream)
            self.marks.append(ev)
        else:
            self.marks.append(time.perf_counter())

    def wait(self) -> None:
        if self.cuda:
            self.marks[-1].synchronize()

    @property
    def end_event(self) -> torch.cuda.Event | None:
        return self.marks[-1] if self.cuda else None

    def elapsed_us(self) -> tuple[int, int]:
        """(forward, sample) in µs; on CUDA only after wait(). Counted from the mark after the
        input copies: the first mark may wait for the host (it times the device idle only).
        Sample: from the mark before the sampling (the forward's end, or the mark a deferred
        sampling starts with) to the last."""
        start, b, c = self.marks[1], self.marks[2], self.marks[-1]
        if self.cuda:
            return int(start.elapsed_time(b) * 1e3), int(self.marks[-2].elapsed_time(c) * 1e3)
        return int((b - start) * 1e6), int((c - self.marks[-2]) * 1e6)

    def idle_before_us(self, prev_end: torch.cuda.Event | None) -> int:
        """µs the device sat idle between prev_end (the previous step's completion) and this
        step's start; ~0 when this step was queued before the previous one ended. CUDA only,
        after wait()."""
        if not self.cuda or prev_end is None:
            return 0
        return max(0, int(prev_end.elapsed_time(self.marks[0]) * 1e3))
