"""The marks of one step: wall clock on CPU, CUDA events on GPU (model_runner.py's timings)."""

from __future__ import annotations

import time

import torch


class StepTimer:
    """Wall-clock marks on CPU; CUDA events on GPU (the last one is the step's completion event),
    recorded on `stream` (the runner's, looked up once: current_stream() costs host time)."""

    def __init__(self, device: torch.device, stream: torch.cuda.Stream | None):
        self.cuda, self.stream = device.type == "cuda", stream
        self.marks = []

    def mark(self) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
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
