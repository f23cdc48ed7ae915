"""The scheduler against the fake executor (benchmarks/scheduler_only.py): every token arrives."""

from benchmarks.scheduler_only import run


def test_scheduler_against_fake_executor_delivers_every_token():
    r = run("w3", step_ms=1.0, stream_interval=1, num_requests=24)
    assert r["tokens"] == 24 * 128
    assert r["steps"] >= 128  # one decode step per output token of the longest request
