"""Runs the HTTP API with uvicorn as a task of the API process's event loop (the grpc.aio
server's loop): the process's own signal handlers stay in charge of shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl

import uvicorn

from scheduler_svc.api.admission import Admission
from scheduler_svc.api.http.app import HttpContext, build_app
from scheduler_svc.api.tools.plan import ToolSettings
from scheduler_svc.api.validation import max_request_bytes
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.core.tokenizer import Tokenizer

log = logging.getLogger("llmserve.scheduler")
# JSON may escape a prompt's characters to 6 bytes each (\uXXXX) and spell an id in up to 11.
JSON_EXPANSION = 6


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):  # SIGINT/SIGTERM belong to scheduler_svc.api.server
        yield

    def install_signal_handlers(self) -> None:  # (older uvicorn)
        pass


class HttpServer:
    """The started server; stop() ends it."""

    def __init__(self, server: _Server, task: asyncio.Task):
        self._server, self._task = server, task

    async def stop(self, timeout: float = 5.0) -> None:
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except (asyncio.TimeoutError, Exception):
            self._server.force_exit = True
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise SystemExit(f"cannot bind the HTTP API to {host}:{port}: {e}") from e
    sock.listen(2048)
    sock.setblocking(False)
    return sock


async def start_http(config: SchedulerConfig, admission: Admission, tokenizer: Tokenizer,
                     metrics=None) -> HttpServer:
    """Binds --host:--http-port (SystemExit when it cannot) and serves until stop(), admitting
    through the process's one Admission (the gRPC door's); `metrics` (api.metrics.Metrics)
    answers GET /metrics."""
    engine, sizes = admission.engine, admission.sizes
    ctx = HttpContext(admission, tokenizer, engine.info.model_name, config.api_key, metrics,
                      config.enable_tokenizer_info_endpoint, ToolSettings.from_config(config),
                      config.responses_store_max_entries, config.responses_store_max_bytes)
    max_body = JSON_EXPANSION * max_request_bytes(sizes, engine.info.max_model_len,
                                                  engine.info.max_logit_bias)
    tls = {}
    if config.ssl_certfile:
        tls = dict(ssl_certfile=config.ssl_certfile, ssl_keyfile=config.ssl_keyfile or None)
        if config.ssl_ca_certs:  # mutual TLS, as on the gRPC port
            tls.update(ssl_ca_certs=config.ssl_ca_certs, ssl_cert_reqs=ssl.CERT_REQUIRED)
    uv_config = uvicorn.Config(build_app(ctx, max_body), lifespan="off", log_config=None, log_level="warning",
                               access_log=False, timeout_graceful_shutdown=2, **tls)
    sock = _bind(config.host, config.http_port)
    server = _Server(uv_config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="llmserve-http")
    while not server.started:
        if task.done():
            task.result()  # its exception
            raise SystemExit("the HTTP API stopped during start-up")
        await asyncio.sleep(0.01)
    log.info("serving the OpenAI-compatible HTTP API on %s://%s:%d (%s)",
             "https" if tls else "http", config.host, config.http_port,
             "API key required" if config.api_key else "no API key")
    return HttpServer(server, task)
