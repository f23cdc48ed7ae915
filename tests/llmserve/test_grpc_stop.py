"""llmserve.grpc_stop: no gRPC call task outlives a stopped server (so that none is cancelled,
and logged by gRPC as an unhandled CancelledError, when the process's event loop closes)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from llmserve.grpc_stop import rpc_tasks, stop_server

SERVICE = "test.Stop"
CLEANUP_S = 0.3  # a handler's cleanup that outlasts gRPC core's end of the call


async def _server_with_open_call(cleanup_done: asyncio.Event):
    entered = asyncio.Event()

    async def execute(requests, context):
        try:
            entered.set()
            async for request in requests:
                await context.write(request)
        finally:  # a cleanup that goes on through the cancellation of the call
            cleanup = asyncio.ensure_future(asyncio.sleep(CLEANUP_S))
            while not cleanup.done():
                try:
                    await asyncio.shield(cleanup)
                except asyncio.CancelledError:
                    pass
            cleanup_done.set()

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
        "Execute": grpc.stream_stream_rpc_method_handler(execute)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    call = channel.stream_stream(f"/{SERVICE}/Execute")()
    await call.write(b"plan")
    assert await call.read() == b"plan"
    await entered.wait()
    return server, channel, call


@pytest.mark.parametrize("helper", [True, False])
def test_no_call_task_outlives_stop_server(helper):
    async def main():
        cleanup_done = asyncio.Event()
        server, channel, call = await _server_with_open_call(cleanup_done)
        names = {t.get_name() for t in rpc_tasks()}  # gRPC still names its call tasks so
        assert {"rpc_task", f"HandleExceptions[/{SERVICE}/Execute]"} <= names, names
        call.cancel()
        if helper:
            await stop_server(server, 0)
        else:
            await server.stop(0)
        left = rpc_tasks()
        done = cleanup_done.is_set()
        if left:
            await asyncio.wait(left, timeout=5)
        await channel.close()
        return left, done

    left, done = asyncio.run(main())
    if helper:
        assert (left, done) == (set(), True)
    else:  # what the helper is for: server.stop returns with the handler still in its cleanup
        assert left and not done
