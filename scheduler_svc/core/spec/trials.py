"""Whether speculation pays at all, measured: alternating windows of steps with and without it.

The per-request gate (gate.py) knows how many drafts a request gets accepted, not what a
verify step costs against a pipelined decode step: that depends on the hardware, the model, the
batch and both services' host time (at batch 64 a speculating batch can lose even with 98% of
its drafts accepted, docs/benchmarks.md). So the scheduler measures it: tokens out per second of
wall time over windows of WINDOW applied steps, speculation on, then a trial window of
TRIAL_WINDOW steps with it off (or the other way round), and keeps the faster mode. The first
comparison comes at once; after that a trial of the losing mode runs every `interval` windows,
the interval doubling (up to MAX_INTERVAL) each time the same mode wins again, so a settled
choice costs little. A mode wins only by MARGIN (noise). A trial is short because it is usually
the losing mode: at batch 1 on a repeated passage, a 32-step window without speculation yields
32 tokens where speculation yields ~150 (docs/benchmarks.md, Run O). The clock is the
scheduler's (time.perf_counter unless a test gives one; one that does not move measures nothing
and so runs no trials: speculation stays on). Idle time
is never measured: a request arriving at an idle scheduler restarts the window (restart()), and
so does a gap of IDLE_GAP_S between two results.
"""

from __future__ import annotations

from collections.abc import Callable

WINDOW = 32  # applied steps a window of the preferred mode
TRIAL_WINDOW = 8  # applied steps a window of the other mode (the first comparison's too)
MARGIN = 1.03  # the other mode must be this much faster to take over
FIRST_INTERVAL = 4  # windows of the preferred mode before the next trial
MAX_INTERVAL = 64
IDLE_GAP_S = 0.25  # a longer wait between two results (the server was idle) restarts the window


class ModeTrials:
    """Decides, window by window, whether speculation is on (`on`)."""

    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self.preferred = True  # speculation on
        self.on = True  # the mode of the current window
        self.rates: dict[bool, float] = {}  # tokens/s of the latest window of each mode
        self.interval = FIRST_INTERVAL
        self.windows_left = 0  # windows of the preferred mode before the next trial
        self._start: float | None = None
        self._last = 0.0  # the time of the latest result
        self._steps = self._tokens = 0

    def restart(self) -> None:
        """The server was idle (no request at all) until now: the window starts again at the
        next result, so idle time never counts against the mode of the window it fell in."""
        self._start = None

    def on_step(self, num_tokens: int) -> None:
        """One applied step and the tokens it produced."""
        now, last = self.clock(), self._last
        self._last = now
        if self._start is None or now - last > IDLE_GAP_S:
            self._start, self._steps, self._tokens = now, 0, 0
            return  # the window starts at its first result (again, after an idle gap)
        self._steps += 1
        self._tokens += num_tokens
        if self._steps >= (WINDOW if self.on == self.preferred else TRIAL_WINDOW):
            self._end_window(now)

    def _end_window(self, now: float) -> None:
        elapsed, tokens = now - self._start, self._tokens
        self._start, self._steps, self._tokens = now, 0, 0
        if elapsed <= 0:
            return  # a clock that does not move (tests): nothing measured, no trials
        self.rates[self.on] = tokens / elapsed
        trial = self.on != self.preferred
        if trial or len(self.rates) < 2:
            if len(self.rates) == 2:
                winner = self.preferred
                if self.rates[not self.preferred] > MARGIN * self.rates[self.preferred]:
                    winner = not self.preferred
                if winner == self.preferred:
                    self.interval = min(2 * self.interval, MAX_INTERVAL)
                else:
                    self.preferred, self.interval = winner, FIRST_INTERVAL
                self.windows_left = self.interval
                self.on = self.preferred
            else:
                self.on = not self.on  # the first window of the other mode
            return
        self.windows_left -= 1
        if self.windows_left <= 0:
            self.on = not self.preferred  # a trial of the other mode
