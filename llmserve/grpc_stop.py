"""Stopping a grpc.aio server so that no RPC task outlives it.

`server.stop(grace)` returns once gRPC core has ended every call, which can be before the
Python tasks that ran them have ended (grpc/grpc#37239). The process's event loop then closes
and asyncio cancels whatever still runs. An RPC whose handler had finished but whose wrapper
task had not yet resumed is cancelled at `await rpc_task`, and gRPC logs that as
"Exception not handled by _handle_exceptions" with two CancelledError tracebacks: a clean
SIGTERM that looks like a crash (CI caught it in the launcher's SIGTERM tests). So the owner of
a server waits for those tasks, for a bounded time, before its loop closes.

gRPC names its per-call tasks (server.pyx.pxi: "rpc_task" and "HandleExceptions[<method>]");
tests/llmserve/test_grpc_stop.py fails if a gRPC release renames them.
"""

from __future__ import annotations

import asyncio

RPC_TASK_NAMES = ("rpc_task", "HandleExceptions[")
RPC_TASKS_TIMEOUT_S = 1.0  # every call has ended in core by then: their tasks take milliseconds


def rpc_tasks() -> set[asyncio.Task]:
    """The running loop's gRPC server call tasks that have not ended."""
    return {t for t in asyncio.all_tasks() if t.get_name().startswith(RPC_TASK_NAMES) and not t.done()}


async def stop_server(server, grace: float | None, timeout_s: float = RPC_TASKS_TIMEOUT_S) -> None:
    """server.stop(grace), then waits up to `timeout_s` for the call tasks to end."""
    await server.stop(grace)
    pending = rpc_tasks()
    if pending:
        await asyncio.wait(pending, timeout=timeout_s)
