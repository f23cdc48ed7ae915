"""Speculation on or off by measured throughput (core/spec/trials.py): windows of steps with
and without it, the faster mode kept, trials of the other spaced out as it keeps losing."""

from __future__ import annotations

import pytest

from scheduler_svc.core.spec import trials as spec_trials
from scheduler_svc.core.spec.trials import FIRST_INTERVAL, TRIAL_WINDOW, WINDOW, ModeTrials
from tests.scheduler.core.spec.test_decoder import SPEC, SpecFakeExecutor, same
from tests.scheduler.sched_driver import make_scheduler, req, run


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def windows(trials: ModeTrials, clock: Clock, rate: dict[bool, float], n: int) -> list[bool]:
    """Runs n windows at the given tokens/s per mode; the mode of each window."""
    modes = []
    for _ in range(n):
        modes.append(trials.on)
        for _ in range(WINDOW if trials.on == trials.preferred else TRIAL_WINDOW):  # a trial is short
            clock.now += 0.01
            trials.on_step(int(rate[trials.on]))
    return modes


def test_the_faster_mode_wins_and_trials_space_out():
    clock = Clock()
    trials = ModeTrials(clock)
    trials.on_step(0)  # the first result starts the first window
    modes = windows(trials, clock, {True: 10, False: 30}, 2 + FIRST_INTERVAL + 1)
    # on, then the first trial (off) wins: off for FIRST_INTERVAL windows, then a trial of on
    assert modes == [True, False] + [False] * FIRST_INTERVAL + [True]
    modes = windows(trials, clock, {True: 10, False: 30}, 2 * FIRST_INTERVAL + 1)
    assert modes == [False] * 2 * FIRST_INTERVAL + [True]  # on lost again: the interval doubled
    modes = windows(trials, clock, {True: 40, False: 30}, 4 * FIRST_INTERVAL + 3)
    # the workload changed: at the next trial (interval 4 * FIRST_INTERVAL) on wins, and is kept
    assert modes[-3:] == [True, True, True] and trials.preferred and trials.interval == FIRST_INTERVAL


def test_an_idle_gap_restarts_the_window():
    clock = Clock()
    trials = ModeTrials(clock)
    trials.on_step(0)
    for i in range(WINDOW - 1):
        clock.now += 0.01
        trials.on_step(1)
    clock.now += 10.0  # idle: the window so far is dropped
    trials.on_step(1)
    for i in range(WINDOW - 1):
        clock.now += 0.01
        trials.on_step(1)
    assert trials.rates == {} and trials.on
    clock.now += 0.01
    trials.on_step(1)
    assert trials.rates == {True: pytest.approx(100.0)} and not trials.on


def test_a_clock_that_does_not_move_runs_no_trials():
    trials = ModeTrials(lambda: 0.0)
    for _ in range(10 * WINDOW):
        trials.on_step(5)
        assert trials.on


class TimedExecutor(SpecFakeExecutor):
    """The speculating fake executor on a clock: a step costs `verify_cost` with drafts, 1
    without (a pipelined decode step)."""

    def __init__(self, block_size: int, clock: Clock, verify_cost: float):
        super().__init__(block_size)
        self.clock, self.verify_cost = clock, verify_cost

    def execute(self, plan):
        self.clock.now += 0.001 * (self.verify_cost if plan.num_draft_tokens else 1.0)
        return super().execute(plan)


def drive_timed(verify_cost: float, spec=SPEC, monkeypatch=None):
    clock = Clock()
    scheduler = make_scheduler(speculative=spec, max_model_len=1024, num_blocks=512)
    if scheduler.spec_steps is not None:
        scheduler.spec_steps.trials.clock = clock
    executor = TimedExecutor(scheduler.config.block_size, clock, verify_cost)
    arrivals = {0: [req(i, [1, 2, 3] * 5, max_tokens=600, ignore_eos=True) for i in range(4)]}
    streams, plans = run(scheduler, arrivals, ahead=3, executor=executor)
    return streams, plans, clock.now


@pytest.mark.parametrize("verify_cost,speculating", [(1.0, True), (12.0, False)])
def test_speculation_is_kept_only_where_it_pays(monkeypatch, verify_cost, speculating):
    """A repeated passage the model continues (every draft accepted): with verify steps as
    cheap as decode steps speculation stays on; when a verify step costs 12 decode steps (more
    than the 1 + 4 tokens it yields), the trials turn it off for most of the run."""
    from tests.scheduler.core.spec import test_decoder

    monkeypatch.setattr(test_decoder, "model", lambda tokens: tokens[-3])
    reference, _, ref_time = drive_timed(1.0, spec=None)
    streams, plans, elapsed = drive_timed(verify_cost)
    assert same(streams, reference)
    late = plans[len(plans) // 2:]
    share = sum(bool(p.num_draft_tokens) for p in late) / len(late)
    if speculating:
        assert share > 0.8 and elapsed < ref_time / 2
    else:
        assert share < 0.2
        always_on = drive_always_on(verify_cost)
        assert elapsed < always_on


def drive_always_on(verify_cost: float) -> float:
    saved = spec_trials.WINDOW
    spec_trials.WINDOW = 10**9  # never a window end: speculation stays on
    try:
        return drive_timed(verify_cost)[2]
    finally:
        spec_trials.WINDOW = saved


def test_a_trial_window_is_short():
    """The mode on trial (usually the slower) runs TRIAL_WINDOW steps, the preferred WINDOW."""
    clock = Clock()
    trials = ModeTrials(clock)
    trials.on_step(0)
    steps = {True: 0, False: 0}
    while len(trials.rates) < 2 or trials.on is False:
        steps[trials.on] += 1
        clock.now += 0.01
        trials.on_step(5 if trials.on else 1)
    assert steps == {True: WINDOW, False: TRIAL_WINDOW} and TRIAL_WINDOW < WINDOW
    assert trials.preferred and trials.on


def test_idle_time_before_a_request_is_not_measured():
    """A request arriving at an idle scheduler restarts the window: a gap shorter than
    IDLE_GAP_S (a client's next request) counts against neither mode."""
    clock = Clock()
    scheduler = make_scheduler(speculative=SPEC, max_model_len=1024, num_blocks=512)
    trials = scheduler.spec_steps.trials
    trials.clock = clock
    trials.on_step(0)
    for _ in range(WINDOW // 2):
        clock.now += 0.001
        trials.on_step(5)
    clock.now += 0.2  # idle, < IDLE_GAP_S: without the restart it would be in the window
    scheduler.add_request(req(0, [1, 2, 3], max_tokens=4))
    for _ in range(WINDOW + 1):
        clock.now += 0.001
        trials.on_step(5)
    assert trials.rates == {True: pytest.approx(5000.0)}
    scheduler.add_request(req(1, [1, 2, 3], max_tokens=4))  # not idle: no restart
    assert trials._start is not None
