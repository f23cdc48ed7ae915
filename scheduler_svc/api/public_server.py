"""Builds the public grpc.aio server: LLMServe behind its guards, health, reflection, and the
port (TLS or plaintext), with the API key check and the receive limit the request caps imply."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from scheduler_svc.api.engine_client import EngineClient
from scheduler_svc.api.handlers import SERVICE_NAME, add_llmserve_servicer
from llmserve.bearer_auth import BearerTokenInterceptor
from protos.reflection import enable_reflection
from scheduler_svc.api.security import API_KEY_HINT
from scheduler_svc.api.servicer import LLMServeServicer
from scheduler_svc.api.tokenize_pool import TokenizePool
from scheduler_svc.api.validation import SizeLimits, max_request_bytes
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.engine.executor_client import MAX_MESSAGE_BYTES

HEALTH_SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
PENDING_CALLS = 16384  # calls gRPC core may hold before the application accepts them


def build_public_server(config: SchedulerConfig, engine: EngineClient, pool: TokenizePool,
                        credentials: grpc.ServerCredentials | None
                        ) -> tuple[grpc.aio.Server, health.aio.HealthServicer]:
    """The server, not started, with its port bound (SystemExit when it cannot be); TLS when
    `credentials` (security.server_credentials, read before the engine starts) are given."""
    sizes = SizeLimits.from_config(config)
    options = [
        # Larger requests are refused by gRPC itself (RESOURCE_EXHAUSTED) before they are parsed.
        ("grpc.max_receive_message_length",
         max_request_bytes(sizes, engine.info.max_model_len, engine.info.max_logit_bias)),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        # gRPC core sheds load silently: with more than 1,000 calls waiting for the application
        # to pick them up (a burst of new streams) it cancels new ones at random (CANCELLED, no
        # log). Admission is ours instead (admission.Admission.check_capacity: an explicit, logged
        # RESOURCE_EXHAUSTED), so the core may queue far more.
        ("grpc.server.max_pending_requests", PENDING_CALLS),
        ("grpc.server.max_pending_requests_hard_limit", 2 * PENDING_CALLS),
        ("grpc.so_reuseport", 1),  # binds beside the starting server (starting_server.py)
    ]
    interceptors = [BearerTokenInterceptor(config.api_key, API_KEY_HINT)] if config.api_key else []
    server = grpc.aio.server(options=options, interceptors=interceptors)
    add_llmserve_servicer(
        LLMServeServicer(engine, pool, sizes, engine.info.model_name, config.max_waiting,
                         config.enable_prefix_caching), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    enable_reflection((SERVICE_NAME, HEALTH_SERVICE_NAME), server)  # v1alpha and v1
    address = f"{config.host}:{config.port}"
    if credentials is None:
        bound = server.add_insecure_port(address)
    else:
        bound = server.add_secure_port(address, credentials)
    if bound == 0:
        raise SystemExit(f"cannot bind {address}")
    return server, health_servicer
