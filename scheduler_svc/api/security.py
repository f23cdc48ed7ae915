"""Who may reach the public API: TLS credentials and the bearer-token check.

TLS (`--ssl-certfile`, `--ssl-keyfile`, optional `--ssl-ca-certs` for client certificates)
protects the connection; the API key (`--api-key` or LLMSERVE_API_KEY) is checked on every
RPC except grpc.health.v1, which load balancers and orchestrators probe without credentials.
Server reflection needs the key too: it describes nothing secret, but an open server should be
a deliberate choice, not a side door.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import grpc

HEALTH_PREFIX = "/grpc.health.v1.Health/"


def server_credentials(certfile: str, keyfile: str, ca_certs: str) -> grpc.ServerCredentials | None:
    """TLS credentials from PEM files; None when no certificate is configured (plaintext)."""
    if not certfile and not keyfile:
        if ca_certs:
            raise SystemExit("--ssl-ca-certs needs --ssl-certfile and --ssl-keyfile")
        return None
    if not (certfile and keyfile):
        raise SystemExit("TLS needs both --ssl-certfile and --ssl-keyfile")
    try:
        chain, key = Path(certfile).read_bytes(), Path(keyfile).read_bytes()
        roots = Path(ca_certs).read_bytes() if ca_certs else None
    except OSError as e:
        raise SystemExit(f"cannot read a TLS file: {e}") from e
    # With a CA bundle every client must present a certificate it signed (mutual TLS).
    return grpc.ssl_server_credentials([(key, chain)], root_certificates=roots,
                                       require_client_auth=roots is not None)


def bearer_token(metadata) -> str:
    """The token of an `authorization: Bearer <token>` header ("" when there is none)."""
    for key, value in metadata or ():
        if key == "authorization":
            scheme, _, token = value.partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return ""


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """Answers UNAUTHENTICATED to any RPC but health without the right bearer token; the
    request is not even parsed. Digests are compared, in constant time: the time taken tells
    neither where a guess goes wrong nor how long the key is."""

    def __init__(self, api_key: str):
        self._key_digest = _digest(api_key)

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(HEALTH_PREFIX):
            return handler
        token = bearer_token(handler_call_details.invocation_metadata)
        if hmac.compare_digest(_digest(token), self._key_digest):
            return handler
        return _refusal(handler, "missing bearer token" if not token else "wrong bearer token")


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def _refusal(handler: grpc.RpcMethodHandler, reason: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that answers UNAUTHENTICATED, reading nothing."""

    async def refuse(request_or_iterator, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                            f"{reason}: send the metadata 'authorization: Bearer <api key>'")

    kind = (handler.request_streaming, handler.response_streaming)
    make = {(False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler}[kind]
    return make(refuse)
