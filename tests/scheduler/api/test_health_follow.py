"""Health follows the engine (api/server.py): a core that dies and is back within one polling
period still shows NOT_SERVING for a period, then SERVING. A restart that fast (0.16 s in CI)
used to leave health SERVING throughout, and a health Watch saw no outage (a flaky test)."""

import asyncio
from types import SimpleNamespace

from grpc_health.v1 import health_pb2

from scheduler_svc.api.server import _follow_executor_health
from scheduler_svc.messages import CoreStats

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


class Health:
    def __init__(self):
        self.statuses = []

    async def set(self, name, status):
        if name == "":
            self.statuses.append(status)


async def _until(condition, timeout=10.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_a_restart_shorter_than_the_polling_period_shows_as_not_serving():
    async def main():
        engine = SimpleNamespace(stats=CoreStats(executor_available=True), restarting=False,
                                 core_lost=asyncio.Event(), num_restarts=0)
        health = Health()
        follow = asyncio.create_task(_follow_executor_health(engine, health, period=0.05))
        await _until(lambda: health.statuses == [SERVING])
        engine.num_restarts += 1  # the core died and is back before the next poll
        await _until(lambda: len(health.statuses) == 3)
        assert health.statuses == [SERVING, NOT_SERVING, SERVING]
        engine.restarting = True  # a slow restart: NOT_SERVING while it lasts
        await _until(lambda: len(health.statuses) == 4)
        await asyncio.sleep(0.2)
        assert health.statuses == [SERVING, NOT_SERVING, SERVING, NOT_SERVING]
        follow.cancel()
    asyncio.run(main())
