"""Builds the public grpc.aio server, bound and started before the executor is known: LLMServe
behind its guards (UNAVAILABLE until the engine is ready), health (NOT_SERVING until then),
reflection, and the port (TLS or plaintext), with the API key check."""

from __future__ import annotations

import logging

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from llmserve.bearer_auth import BearerTokenInterceptor
from protos.reflection import enable_reflection
from scheduler_svc.api.grpc.handlers import SERVICE_NAME, LLMServeHandlers
from scheduler_svc.api.grpc.security import API_KEY_HINT
from scheduler_svc.api.validation import SizeLimits, max_request_bytes
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.engine.executor_client import MAX_MESSAGE_BYTES

log = logging.getLogger("llmserve.scheduler")
HEALTH_SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
PENDING_CALLS = 16384  # calls gRPC core may hold before the application accepts them
# gRPC's own receive limit is fixed when the server is built, before the executor reports the
# model's context length: it allows token-id prompts of models up to this context (10 bytes an
# id at worst). The exact limit of the served model is checked before parsing (handlers.py).
TRANSPORT_MAX_MODEL_LEN = 1 << 20


class PublicServer:
    """The server and what serve() switches on it once the engine is ready."""

    def __init__(self, server: grpc.aio.Server, health_servicer: health.aio.HealthServicer,
                 handlers: LLMServeHandlers, transport_limit: int):
        self.server = server
        self.health = health_servicer
        self.handlers = handlers
        self.transport_limit = transport_limit

    def serve_with(self, servicer, sizes: SizeLimits, max_model_len: int, max_logit_bias: int) -> None:
        limit = max_request_bytes(sizes, max_model_len, max_logit_bias)
        if limit > self.transport_limit:
            log.warning("requests over %d bytes are refused by gRPC (its limit is fixed at start for "
                        "contexts up to %d tokens): token-id prompts near max_model_len %d may not fit",
                        self.transport_limit, TRANSPORT_MAX_MODEL_LEN, max_model_len)
        self.handlers.serve_with(servicer, min(limit, self.transport_limit))


async def start_public_server(config: SchedulerConfig, credentials: grpc.ServerCredentials | None
                              ) -> PublicServer:
    """The server, bound and started (SystemExit when the port cannot be bound): health
    NOT_SERVING and every LLMServe call UNAVAILABLE until `serve_with`. TLS when `credentials`
    (security.server_credentials) are given."""
    transport_limit = max_request_bytes(SizeLimits.from_config(config), TRANSPORT_MAX_MODEL_LEN)
    options = [
        # Larger requests are refused by gRPC itself (RESOURCE_EXHAUSTED) before they are parsed.
        ("grpc.max_receive_message_length", transport_limit),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        # gRPC core sheds load silently: with more than 1,000 calls waiting for the application
        # to pick them up (a burst of new streams) it cancels new ones at random (CANCELLED, no
        # log). Admission is ours instead (admission.Admission.check_capacity: an explicit, logged
        # RESOURCE_EXHAUSTED), so the core may queue far more.
        ("grpc.server.max_pending_requests", PENDING_CALLS),
        ("grpc.server.max_pending_requests_hard_limit", 2 * PENDING_CALLS),
    ]
    interceptors = [BearerTokenInterceptor(config.api_key, API_KEY_HINT)] if config.api_key else []
    server = grpc.aio.server(options=options, interceptors=interceptors)
    handlers = LLMServeHandlers()
    server.add_generic_rpc_handlers((handlers,))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    enable_reflection((SERVICE_NAME, HEALTH_SERVICE_NAME), server)  # v1alpha and v1
    address = f"{config.host}:{config.port}"
    try:
        bound = (server.add_insecure_port(address) if credentials is None
                 else server.add_secure_port(address, credentials))
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise SystemExit(f"cannot bind {address}")
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    await server.start()
    log.info("public port %s answers NOT_SERVING until the executor is ready", address)
    return PublicServer(server, health_servicer, handlers, transport_limit)
