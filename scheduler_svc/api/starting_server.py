"""What the public port answers while the executor is still starting: health NOT_SERVING and
UNAVAILABLE ("still starting") for every LLMServe call, instead of refused connections.

It binds the public address with SO_REUSEPORT, so the real server binds the same port beside
it before it is stopped: there is no moment where connections are refused.
"""

from __future__ import annotations

import logging

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from scheduler_svc.api.handlers import SERVICE_NAME

log = logging.getLogger("llmserve.scheduler")
_MESSAGE = "the server is starting: the executor is not ready yet; retry shortly"


class _Starting(grpc.GenericRpcHandler):
    def service(self, handler_call_details):
        if not handler_call_details.method.startswith(f"/{SERVICE_NAME}/"):
            return None  # UNIMPLEMENTED, as for any unknown service

        async def unavailable(request, context):
            await context.abort(grpc.StatusCode.UNAVAILABLE, _MESSAGE)

        # every LLMServe method takes one request message, so a unary handler can answer
        # each of them (it aborts before any response)
        return grpc.unary_unary_rpc_method_handler(unavailable)


async def start_starting_server(host: str, port: int, credentials) -> grpc.aio.Server | None:
    """Serves the placeholder on host:port; None when the port cannot be bound (the real
    server then reports that itself)."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 1)])
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    server.add_generic_rpc_handlers((_Starting(),))
    address = f"{host}:{port}"
    try:
        bound = (server.add_insecure_port(address) if credentials is None
                 else server.add_secure_port(address, credentials))
    except RuntimeError:
        bound = 0
    if bound == 0:
        return None
    for name in ("", SERVICE_NAME):
        await servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    await server.start()
    log.info("public port %s answers NOT_SERVING until the executor is ready", address)
    return server
