"""The executor's one credential check: a server interceptor that lets a call through only with
the scheduler's internal token (`authorization: Bearer <token>`).

The executor API can reset every request, finish other requests and overwrite cached KV, so
only the scheduler that was given the token may call it. The health service stays open (a
liveness probe carries no secret and changes nothing).
"""

from __future__ import annotations

import hashlib
import hmac

import grpc

AUTHORIZATION = "authorization"  # gRPC metadata keys are lower case
OPEN_SERVICES = ("/grpc.health.v1.Health/",)
DENIED = ("missing or wrong internal token: the executor serves only its scheduler; give both "
          "services the same secret (LLMSERVE_INTERNAL_TOKEN, or --internal-token on each)")


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Answers UNAUTHENTICATED to every call outside OPEN_SERVICES whose `authorization`
    metadata is not `Bearer <token>`. SHA-256 digests are compared with hmac.compare_digest:
    the time tells neither where a guess differs nor how long the token is."""

    def __init__(self, token: str):
        if not token:
            raise ValueError("an empty internal token would let everyone in")
        self._expected = _digest(f"Bearer {token}")

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_SERVICES):
            return handler  # None: unknown method, grpc answers UNIMPLEMENTED
        if self._authorized(handler_call_details.invocation_metadata or ()):
            return handler
        return _denying(handler)

    def _authorized(self, metadata) -> bool:
        sent = [value for key, value in metadata if key == AUTHORIZATION]
        if len(sent) != 1 or not isinstance(sent[0], str):
            return False
        return hmac.compare_digest(_digest(sent[0]), self._expected)


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()


async def _deny(request_or_iterator, context) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, DENIED)


def _denying(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same streaming kind as `handler` that only refuses: nothing of the
    request is read, nothing reaches the servicer."""
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(_deny)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(_deny)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(_deny)
    return grpc.unary_unary_rpc_method_handler(_deny)
