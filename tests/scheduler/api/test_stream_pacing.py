"""The Pacer: the gap grows while the API process's event loop lags and shrinks to zero when it
keeps up; with no streams it measures nothing and the gap is zero."""

import asyncio
import time

from scheduler_svc.api.stream_pacing import LAG_LIMIT_S, PERIOD_S, Pacer


def test_the_gap_doubles_under_lag_up_to_its_bound_and_halves_to_zero():
    p = Pacer(0.05)
    gaps = []
    for _ in range(8):
        p.observe(LAG_LIMIT_S * 2)
        gaps.append(round(p.gap, 6))
    assert gaps == [0.001, 0.003, 0.007, 0.015, 0.031, 0.05, 0.05, 0.05]
    p.observe(LAG_LIMIT_S)  # not over the limit
    assert p.gap == 0.025
    for _ in range(6):
        p.observe(0.0)
    assert p.gap == 0.025 / 64
    p.observe(0.0)  # below MIN_GAP_S: zero
    assert p.gap == 0.0


def test_a_blocked_loop_opens_a_gap_and_a_free_one_closes_it():
    async def main():
        p = Pacer(0.05, lag_limit_s=0.1)  # (a limit no busy test machine reaches by itself)
        streams = [1]
        watch = asyncio.create_task(p.run(lambda: bool(streams)))
        await asyncio.sleep(0)
        for _ in range(2):
            time.sleep(0.25)  # the loop does nothing else for 250 ms: it lags
            await asyncio.sleep(PERIOD_S)
        assert p.gap == 0.003
        await asyncio.sleep(0.3)  # a free loop: the gap halves to zero
        assert p.gap == 0.0
        streams.clear()
        p.gap = 0.04
        await asyncio.sleep(3 * PERIOD_S)
        assert p.gap == 0.0  # no streams: no gap, and the watch waits for the next stream
        assert not watch.done()
        watch.cancel()
    asyncio.run(main())


def test_the_flag_default_environment_and_bounds(monkeypatch, capsys):
    import pytest

    from scheduler_svc.api.engine_client import EngineClient
    from scheduler_svc.config import from_args

    assert from_args([]).stream_pacing_ms == 50.0
    assert EngineClient(from_args(["--stream-pacing-ms", "20"])).pacer.max_gap == 0.02
    monkeypatch.setenv("LLMSERVE_SCHEDULER_STREAM_PACING_MS", "0")
    assert from_args([]).stream_pacing_ms == 0.0  # off: start() runs no lag watch
    for bad in ("-1", "1001", "nan"):
        with pytest.raises(SystemExit):
            from_args(["--stream-pacing-ms", bad])
        assert "--stream-pacing-ms must be in [0, 1000]" in capsys.readouterr().err
