"""Who may reach the public API: TLS credentials and the bearer-token check.

TLS (`--ssl-certfile`, `--ssl-keyfile`, optional `--ssl-ca-certs` for client certificates)
protects the connection; the API key (`--api-key` or LLMSERVE_API_KEY) is checked on every
RPC (llmserve.bearer_auth, the check the executor's internal token uses too) except grpc.health.v1, which load balancers and orchestrators probe without credentials.
Server reflection needs the key too: it describes nothing secret, but an open server should be
a deliberate choice, not a side door.
"""

from __future__ import annotations

from pathlib import Path

import grpc

API_KEY_HINT = "send the metadata 'authorization: Bearer <api key>'"


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
