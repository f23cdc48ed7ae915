"""The executor's gRPC endpoint: a process of its own, so that no gRPC, protobuf or event-loop
Python runs beside the device process's two step threads (docs/executor.md, "One thread, one job").

It serves the Executor service (servicer.py: bytes in, bytes out), grpc.health.v1 and, when asked
for, reflection, behind the internal token (llmserve/bearer_auth.py), on the port the device
process names; it imports no torch. It talks to the device process over one inherited socket
(link.py). Lifetime: it exits when the link reaches end of file (the device process has gone),
the kernel kills it when its parent dies (PR_SET_PDEATHSIG, Linux), and it ignores SIGINT and
SIGTERM (Ctrl-C reaches the whole process group): the device process stops it with a stop frame.

EndpointProcess is the device process's handle on it: start, ready, stop, wait.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from typing import TYPE_CHECKING

from executor_svc.service import link
from llmserve.lifetime import die_with_parent
from llmserve.logs import configure_logging

if TYPE_CHECKING:
    from executor_svc.config import ExecutorConfig

log = logging.getLogger("executor_svc.endpoint")
MAX_MESSAGE_BYTES = 64 << 20
GRPC_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
INTERNAL_TOKEN_HINT = ("the executor serves only its scheduler, which sends the internal token: "
                       "give both services the same secret (LLMSERVE_INTERNAL_TOKEN, or "
                       "--internal-token on each)")


class EndpointProcess:
    """The endpoint child, as its parent (the device process) sees it."""

    def __init__(self, proc: subprocess.Popen, link_: link.BlockingLink):
        self.proc, self.link = proc, link_

    @classmethod
    def start(cls, config: ExecutorConfig, info: bytes) -> EndpointProcess:
        """Starts the child and sends it its start frame (the token goes there, never on a
        command line). Call from the thread that lives as long as the process: on Linux the
        child's death signal follows the thread that started it."""
        ours, theirs = socket.socketpair()
        fd = theirs.fileno()
        proc = subprocess.Popen([sys.executable, "-m", "executor_svc.service.endpoint", "--fd", str(fd),
                                 "--parent-pid", str(os.getpid())], pass_fds=(fd,), stdin=subprocess.DEVNULL)
        theirs.close()  # the child's now: its exit is this end's end of file
        endpoint = cls(proc, link.BlockingLink(ours))
        start = {"host": config.host, "port": config.port, "token": config.internal_token,
                 "reflection": config.enable_reflection, "info": base64.b64encode(info).decode()}
        endpoint.link.send(link.START, body=json.dumps(start).encode())
        return endpoint

    def wait_ready(self) -> int:
        """The port it serves on, once it does (blocks); EOFError when it exits first."""
        frame = self.link.recv()
        if frame.kind != link.READY:
            raise link.LinkBroken(f"the endpoint's first frame is {frame.kind!r}, not ready")
        return frame.tag

    def stop(self, grace_s: float) -> None:
        """Asks it to stop serving (health NOT_SERVING, open calls get `grace_s`) and exit; never
        waits for a stuck endpoint (wait() kills it)."""
        self.link.send_nowait(link.STOP, int(grace_s * 1000), lock_s=1.0)

    def wait(self, timeout: float) -> int:
        """Its exit status, killing it after `timeout` seconds."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


async def _serve(sock: socket.socket) -> None:
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    from executor_svc.service.servicer import SERVICE, ExecutorEndpoint
    from llmserve.bearer_auth import BearerTokenInterceptor
    from llmserve.grpc_stop import stop_server
    from protos.reflection import enable_reflection

    reader, writer = await asyncio.open_unix_connection(sock=sock)
    try:
        start = await link.read_frame(reader)
    except EOFError:
        return  # the device process ended first
    config = json.loads(start.body)
    token = config["token"]
    server = grpc.aio.server(options=GRPC_OPTIONS, interceptors=[BearerTokenInterceptor(
        token, INTERNAL_TOKEN_HINT)] if token else [])  # no token: the device checked insecure_no_auth
    endpoint = ExecutorEndpoint(base64.b64decode(config["info"]), writer)
    server.add_generic_rpc_handlers((endpoint.handler(),))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if config["reflection"]:  # off by default: it would map the internal API for anyone
        enable_reflection((SERVICE, health.SERVICE_NAME), server)  # v1alpha and v1
    address = f"{config['host']}:{config['port']}"
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as e:
        raise SystemExit(f"llmserve-executor: error: cannot serve on {address}: {e}") from None
    await server.start()
    for name in (SERVICE, ""):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    writer.write(link.encode(link.READY, port))
    stopping = asyncio.get_running_loop().create_future()  # the grace of a stop frame
    router = asyncio.ensure_future(_route(reader, endpoint, stopping))
    await asyncio.wait([router, stopping], return_when=asyncio.FIRST_COMPLETED)
    if not stopping.done():
        log.warning("the device process has gone (%s): stopping", router.exception() or "end of file")
    await health_servicer.enter_graceful_shutdown()
    await stop_server(server, stopping.result() if stopping.done() else 0)  # results still come meanwhile
    router.cancel()
    writer.close()


async def _route(reader: asyncio.StreamReader, endpoint, stopping: asyncio.Future) -> None:
    """The device process's frames, until the link ends."""
    while True:
        try:
            frame = await link.read_frame(reader)
        except EOFError:
            return
        if frame.kind == link.STOP:
            if not stopping.done():
                stopping.set_result(frame.tag / 1000)
        else:
            endpoint.on_frame(frame)


def main(argv: list[str] | None = None) -> None:
    """python -m executor_svc.service.endpoint --fd N --parent-pid P (the device process starts it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the device process decides when this one stops
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    p = argparse.ArgumentParser(prog="llmserve-executor-endpoint")
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--parent-pid", type=int, required=True)
    args = p.parse_args(argv)
    die_with_parent(signal.SIGKILL, args.parent_pid)  # (the link's end of file is the fallback)
    configure_logging("INFO", "executor", "endpoint")
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    run(_serve(socket.socket(fileno=args.fd)))


if __name__ == "__main__":
    main()
