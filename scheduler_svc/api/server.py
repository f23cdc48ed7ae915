"""Scheduler process: connects to the executor, then serves the public API on a grpc.aio server."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from grpc_health.v1 import health_pb2

from scheduler_svc.api import access_log
from scheduler_svc.api.engine_client import CoreStartError, EngineClient
from scheduler_svc.api.handlers import SERVICE_NAME
from scheduler_svc.api.metrics import Metrics
from scheduler_svc.api.public_server import start_public_server
from scheduler_svc.api.security import server_credentials
from scheduler_svc.api.servicer import LLMServeServicer
from scheduler_svc.api.tokenize_pool import TokenizePool
from scheduler_svc.api.validation import SizeLimits
from scheduler_svc.config import SchedulerConfig, from_args
from scheduler_svc.core.tokenizer import Tokenizer
from scheduler_svc.runtime import configure_logging, run_async

log = logging.getLogger("llmserve.scheduler")


async def serve(config: SchedulerConfig) -> bool:
    """Serves until SIGINT/SIGTERM (returns True) or until the engine core dies (False)."""
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # from the start: a stop during start-up is clean
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
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
        await public.server.stop(None)
        raise
    if info is None:
        log.info("stopped during start-up")
        await public.server.stop(None)
        return True
    log.info("executor ready: model %s, %d KV blocks of %d tokens, max_model_len %d, graphs %s",
             info.model_name, info.num_blocks, info.block_size, info.max_model_len,
             list(info.cuda_graph_sizes) or "off")
    metrics.bind(engine, info.model_name, info.max_model_len)
    try:
        return await _serve_ready(config, engine, public, metrics, stop, credentials)
    finally:
        await engine.stop()


async def _serve_ready(config: SchedulerConfig, engine: EngineClient, public, metrics: Metrics,
                       stop: asyncio.Event, credentials) -> bool:
    """With the engine ready: loads the tokenizer, switches the public server to the servicer,
    serves until `stop` or the core's loss, then drains the servers."""
    info = engine.info
    pool = None
    watch = None
    http = None
    try:
        # Off the event loop: the public server on this loop keeps answering health meanwhile.
        tokenizer = await asyncio.to_thread(Tokenizer.from_pretrained, config.tokenizer or info.model_path)
        pool = TokenizePool(tokenizer, config.tokenizer_pool_size, max_pending=config.max_waiting)
        sizes = SizeLimits.from_config(config)
        public.serve_with(LLMServeServicer(engine, pool, sizes, info.model_name, config.max_waiting,
                                           config.enable_prefix_caching),
                          sizes, info.max_model_len, info.max_logit_bias)
        watch = asyncio.create_task(_follow_executor_health(engine, public.health))
        if config.metrics_port:
            metrics.serve(config.metrics_port)
        if config.http_port:  # the OpenAI-compatible HTTP API, on the same engine and loop
            from scheduler_svc.api.http.serve import start_http

            http = await start_http(config, engine, pool, tokenizer, metrics)
        log.info("serving llmserve.v1.LLMServe on %s:%d (%s, %s)", config.host, config.port,
                 "TLS" if credentials else "plaintext",
                 "API key required" if config.api_key else "no API key")
        await asyncio.wait([asyncio.create_task(stop.wait()), asyncio.create_task(engine.core_lost.wait())],
                           return_when=asyncio.FIRST_COMPLETED)
        log.info("shutting down")
        return stop.is_set() or not engine.core_lost.is_set()
    finally:
        if watch is not None:
            watch.cancel()
        await public.health.enter_graceful_shutdown()
        if http is not None:
            await http.stop()
        await public.server.stop(grace=2.0)
        if pool is not None:
            pool.close()


async def _follow_executor_health(engine: EngineClient, health_servicer, period: float = 0.2) -> None:
    """Health is SERVING exactly while the engine core reports a live executor: NOT_SERVING
    while it reconnects to a dead or hung one, SERVING again once it is back."""
    serving = None
    while True:
        available = engine.stats.executor_available and not engine.core_lost.is_set()
        if available != serving:
            status = health_pb2.HealthCheckResponse.SERVING if available else \
                health_pb2.HealthCheckResponse.NOT_SERVING
            for name in ("", SERVICE_NAME):
                await health_servicer.set(name, status)
            if serving is not None:
                log.warning("executor %s: health %s", "back" if available else "unavailable",
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
        ok = run_async(serve(config))
    except KeyboardInterrupt:
        ok = True
    except CoreStartError as e:
        sys.exit(f"llmserve-scheduler: {e}")
    if not ok:
        sys.exit("the engine core process exited")


if __name__ == "__main__":
    main()
