"""The one bearer-token check of both services: a grpc.aio server interceptor that lets a call
through only with `authorization: Bearer <secret>` (the public API's --api-key, the executor's
internal token). grpc.health.v1 stays open: probes carry no secret and change nothing.
"""

from __future__ import annotations

import hashlib
import hmac

import grpc

OPEN_PREFIX = "/grpc.health.v1.Health/"


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Answers UNAUTHENTICATED (reading nothing of the request) to a call without exactly one
    `authorization: Bearer <secret>` entry; `hint` tells the client what to send. SHA-256
    digests are compared in constant time: the time taken tells neither where a guess goes
    wrong nor how long the secret is."""

    def __init__(self, secret: str, hint: str):
        if not secret:
            raise ValueError("an empty secret would let everyone in")
        self._digest = _digest(secret)
        self._hint = hint

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_PREFIX):
            return handler  # None: an unknown method, which grpc answers UNIMPLEMENTED
        token = bearer_token(handler_call_details.invocation_metadata)
        if token and hmac.compare_digest(_digest(token), self._digest):
            return handler
        return _refusal(handler, f"{'wrong' if token else 'missing'} bearer token; {self._hint}")


def bearer_token(metadata) -> str:
    """The token of the one `authorization: Bearer <token>` entry ("" when there is none, more
    than one, or another scheme)."""
    values = [value for key, value in metadata or () if key == "authorization"]
    if len(values) != 1 or not isinstance(values[0], str):
        return ""
    scheme, _, token = values[0].partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def _refusal(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same streaming kind as `handler` that only refuses."""

    async def refuse(request_or_iterator, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    make = {(False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler}
    return make[(handler.request_streaming, handler.response_streaming)](refuse)
