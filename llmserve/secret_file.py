"""A secret read from a file at start (--internal-token-file; Docker's and Kubernetes' way of
handing a container a secret without it showing in `docker inspect`, logs or a command line).
Both services read the internal token this way when no token is given directly."""

from __future__ import annotations

MAX_SECRET_BYTES = 4096


def read_secret(path: str, flag: str) -> str:
    """The file's text without surrounding whitespace; SystemExit naming the flag and the file
    when it cannot be read, is empty, too large or not printable ASCII (a token is sent as a
    gRPC metadata value)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SECRET_BYTES + 1)
    except OSError as e:
        raise SystemExit(f"{flag}: cannot read {path}: {e.strerror or e}") from e
    if len(data) > MAX_SECRET_BYTES:
        raise SystemExit(f"{flag}: {path} is over {MAX_SECRET_BYTES} bytes: not a token")
    text = data.strip()
    if not text:
        raise SystemExit(f"{flag}: {path} is empty")
    if not all(0x21 <= b <= 0x7E for b in text):
        raise SystemExit(f"{flag}: {path} holds other than printable ASCII without spaces")
    return text.decode("ascii")


def token_or_file(token: str, path: str, flag: str = "--internal-token-file") -> str:
    """A token given directly, else the one in `path` (read_secret), else ""."""
    return token or (read_secret(path, flag) if path else "")
