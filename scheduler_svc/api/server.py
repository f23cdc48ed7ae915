"""Scheduler process: connects to the executor, then serves the public API on a grpc.aio server."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from grpc_health.v1 import health_pb2

from llmserve.grpc_stop import stop_server
from llmserve.heap import freeze_startup_heap
from llmserve.logs import configure_logging
from scheduler_svc.api import access_log
from scheduler_svc.api.admission import Admission
from scheduler_svc.api.engine_client import CoreStartError, EngineClient
from scheduler_svc.api.grpc.handlers import SERVICE_NAME
from scheduler_svc.api.grpc.public_server import start_public_server
from scheduler_svc.api.grpc.security import server_credentials
from scheduler_svc.api.grpc.servicer import LLMServeServicer
from scheduler_svc.api.metrics import Metrics
from scheduler_svc.api.tokenize_pool import TokenizePool
from scheduler_svc.api.validation import SizeLimits
from scheduler_svc.config import SchedulerConfig, from_args
from scheduler_svc.core.tokenizer import Tokenizer
from scheduler_svc.runtime import run_async

log = logging.getLogger("llmserve.scheduler")


async def serve(config: SchedulerConfig) -> tuple[int, str]:
    """Serves until SIGINT/SIGTERM (exit code 0) or until the engine core dies and cannot be
    restarted (1); returns the exit code and why."""
    stop = asyncio.Event()
    signals: list[str] = []  # the one that stopped us, for the last log line

    def on_signal(sig: signal.Signals) -> None:
        signals.append(sig.name)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):  # from the start: a stop during start-up is clean
        asyncio.get_running_loop().add_signal_handler(sig, on_signal, sig)
    # TLS files are read first: a missing certificate should not wait for the executor.
    credentials = server_credentials(config.ssl_certfile, config.ssl_keyfile, config.ssl_ca_certs)
    metrics = Metrics()  # the one registry of this process
    access_log.configure(enabled=not config.disable_log_requests)
    engine = EngineClient(config, metrics)
    public = await start_public_server(config, credentials)  # answers at once: "starting"
    log.info("waiting for the executor at %s", config.executor_address)
    try:
        info = await _start_unless_stopped(engine, stop)
    except BaseException:
        await stop_server(public.server, None)
        raise
    if info is None:
        await stop_server(public.server, None)
        return 0, f"stopped by {signals[0]} during start-up"
    log.info("executor ready: model %s, %d KV blocks of %d tokens, max_model_len %d, graphs %s",
             info.model_name, info.num_blocks, info.block_size, info.max_model_len,
             list(info.cuda_graph_sizes) or "off")
    metrics.bind(engine, info.model_name, info.max_model_len)
    try:
        if await _serve_ready(config, engine, public, metrics, stop, credentials):
            return 0, f"stopped by {signals[0]}"
        return 1, "the engine core process died and could not be restarted"
    finally:
        await engine.stop()


async def _serve_ready(config: SchedulerConfig, engine: EngineClient, public, metrics: Metrics,
                       stop: asyncio.Event, credentials) -> bool:
    """With the engine ready: loads the tokenizer, switches the public server to the servicer,
    serves until `stop` (True) or the core's loss past its restarts (False), then drains the
    servers. A core that dies is restarted by the engine client meanwhile (health follows)."""
    info = engine.info
    pool = admission = None
    watch = None
    http = None
    try:
        # Off the event loop: the public server on this loop keeps answering health meanwhile.
        tokenizer = await asyncio.to_thread(Tokenizer.from_pretrained, config.tokenizer or info.model_path)
        pool = TokenizePool(tokenizer, config.tokenizer_pool_size, max_pending=config.max_waiting)
        sizes = SizeLimits.from_config(config)
        # one admission for both doors: one capacity count, one grammar compiler and cache
        admission = Admission(engine, pool, sizes, config.max_waiting, config.enable_prefix_caching)
        public.serve_with(LLMServeServicer(admission, info.model_name),
                          sizes, info.max_model_len, info.max_logit_bias)
        watch = asyncio.create_task(_follow_executor_health(engine, public.health))
        if config.metrics_port:
            metrics.serve(config.metrics_port)
        if config.http_port:  # the OpenAI-compatible HTTP API, on the same engine and loop
            from scheduler_svc.api.http.serve import start_http

            http = await start_http(config, admission, tokenizer, metrics)
        freeze_startup_heap(log, full_collect=False)  # (the public port answers meanwhile: llmserve/heap.py)
        log.info("serving llmserve.v1.LLMServe on %s:%d (%s, %s)", config.host, config.port,
                 "TLS" if credentials else "plaintext",
                 "API key required" if config.api_key else "no API key")
        await asyncio.wait([asyncio.create_task(stop.wait()), asyncio.create_task(engine.core_lost.wait())],
                           return_when=asyncio.FIRST_COMPLETED)
        log.info("shutting down (%s)", "stop signal" if stop.is_set() else "the engine core is gone")
        return stop.is_set()
    finally:
        if watch is not None:
            watch.cancel()
        await public.health.enter_graceful_shutdown()
        if http is not None:
            await http.stop()
        await stop_server(public.server, grace=2.0)
        if admission is not None:
            admission.close()
        if pool is not None:
            pool.close()


async def _follow_executor_health(engine: EngineClient, health_servicer, period: float = 0.2) -> None:
    """Health is SERVING exactly while the engine core reports a live executor: NOT_SERVING
    while it reconnects to a dead or hung one, or while the core itself restarts (the engine
    client resets its stats then), SERVING again once it is back. A core that died and was
    restarted within one polling period still shows NOT_SERVING for a period
    (engine.num_restarts): Watch streams send only the latest status they see."""
    serving, restarts = None, engine.num_restarts
    while True:
        available = (engine.stats.executor_available and not engine.restarting
                     and not engine.core_lost.is_set() and engine.num_restarts == restarts)
        restarts = engine.num_restarts
        if available != serving:
            status = health_pb2.HealthCheckResponse.SERVING if available else \
                health_pb2.HealthCheckResponse.NOT_SERVING
            for name in ("", SERVICE_NAME):
                await health_servicer.set(name, status)
            if serving is not None:
                log.warning("%s: health %s", "the engine is back" if available else
                            "the executor or the engine core is unavailable",
                            health_pb2.HealthCheckResponse.ServingStatus.Name(status))
            serving = available
        await asyncio.sleep(period)


async def _start_unless_stopped(engine: EngineClient, stop: asyncio.Event):
    """The executor's info once the engine core is up, or None when `stop` came first (the
    cancelled start leaves no core process behind)."""
    starting = asyncio.create_task(engine.start())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if starting.done():
        return starting.result()
    starting.cancel()
    await asyncio.gather(starting, return_exceptions=True)
    return None


def main(argv: list[str] | None = None) -> None:
    """Console entry point: llmserve-scheduler [flags]. SIGTERM and Ctrl-C stop it with exit 0
    and no traceback, at any point of start-up."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # until the loop's handlers take over
    config = from_args(argv)
    configure_logging(config.log_level, "scheduler")
    try:
        code, why = run_async(serve(config))
    except KeyboardInterrupt:  # a signal before the loop's handlers were in place
        code, why = 0, "stopped by a signal during start-up"
    except CoreStartError as e:  # one line on stderr says why, and the exit code is 1
        sys.exit(f"llmserve-scheduler: {e}")
    (log.info if code == 0 else log.error)("llmserve-scheduler: exiting with code %d: %s", code, why)
    sys.exit(code)


if __name__ == "__main__":
    main()
