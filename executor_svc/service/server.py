"""Executor process: load the model, then serve the executor API (to the holder of the internal
token only: llmserve/bearer_auth.py), health and, when asked for, reflection."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from executor_svc.config import ExecutorConfig
from llmserve.heap import freeze_startup_heap
from llmserve.logs import configure_logging

log = logging.getLogger("executor_svc")
MAX_MESSAGE_BYTES = 64 << 20
GRPC_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]


async def serve(config: ExecutorConfig, on_ready: Callable[[int], None] | None = None,
                stop: asyncio.Event | None = None) -> None:
    """Runs until `stop` is set (or SIGINT/SIGTERM); on_ready(bound_port) once serving.
    All grpc objects are created inside this running loop. Without an internal token (and
    without insecure_no_auth), or for a model that cannot be served (model_checks), raises
    SystemExit with one line saying why, before anything is served."""
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    from executor_svc.model_loader.checks import ModelError
    from executor_svc.service.servicer import ExecutorServicer
    from executor_svc.startup.build import build_runner
    from protos.llmserve.executor.v1 import executor_pb2, executor_pb2_grpc
    from protos.reflection import enable_reflection

    interceptors = _auth_interceptors(config)
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            pass
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="executor-step")
    waiter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="executor-wait")
    t0 = time.perf_counter()
    build = build_runner
    if config.tensor_parallel_size > 1:  # this process is rank 0 and starts the others
        from executor_svc.parallel.launch import build_parallel_runner as build
    try:
        runner = await loop.run_in_executor(worker, build, config)  # the loop stays responsive
    except ModelError as e:  # the user's to fix: one line, no traceback
        worker.shutdown(wait=False)
        waiter.shutdown(wait=False)
        _refuse(str(e))
    failure: list[str] = []  # tensor parallelism: why another rank ended the service

    def on_failure(reason: str) -> None:  # from the ranks' watchdog thread
        failure.append(reason)
        loop.call_soon_threadsafe(stop.set)

    runner.watch(on_failure)
    info = runner.info()
    log.info("ready in %.1f s: model %s, %d KV blocks of %d tokens, graphs %s",
             time.perf_counter() - t0, info.model_name, info.num_blocks, info.block_size,
             list(info.cuda_graph_sizes) or "off (eager)")

    server = grpc.aio.server(options=GRPC_OPTIONS, interceptors=interceptors)
    executor_pb2_grpc.add_ExecutorServicer_to_server(ExecutorServicer(runner, worker, waiter), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    service = executor_pb2.DESCRIPTOR.services_by_name["Executor"].full_name
    if config.enable_reflection:  # off by default: it would map the internal API for anyone
        enable_reflection((service, health.SERVICE_NAME), server)  # v1alpha and v1
    port = server.add_insecure_port(f"{config.host}:{config.port}")
    freeze_startup_heap(log)  # (the model, graphs and warm-up garbage: llmserve/heap.py)
    await server.start()
    for name in (service, ""):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("serving on %s:%d", config.host, port)
    if on_ready is not None:
        on_ready(port)
    await stop.wait()
    log.info("stopping")
    await health_servicer.enter_graceful_shutdown()
    await server.stop(grace=0 if failure else 5.0)
    if failure:  # a step may wait on the dead rank: leave it (launch.py exits this process)
        worker.shutdown(wait=False, cancel_futures=True)
        waiter.shutdown(wait=False)
        _refuse(failure[0])
    worker.shutdown(wait=True)
    waiter.shutdown(wait=True)
    runner.close()  # the other ranks of a tensor-parallel executor, if any


INTERNAL_TOKEN_HINT = ("the executor serves only its scheduler, which sends the internal token: "
                       "give both services the same secret (LLMSERVE_INTERNAL_TOKEN, or "
                       "--internal-token on each)")


def _auth_interceptors(config: ExecutorConfig) -> list:
    """The token check on every call, or nothing with insecure_no_auth; no token and no
    insecure_no_auth: SystemExit (an executor anyone local can drive must be asked for)."""
    from llmserve.bearer_auth import BearerTokenInterceptor

    if config.internal_token:
        return [BearerTokenInterceptor(config.internal_token, INTERNAL_TOKEN_HINT)]
    if not config.insecure_no_auth:
        _refuse("no internal token: set LLMSERVE_INTERNAL_TOKEN (or --internal-token) to the secret "
                "the scheduler sends, or pass --insecure-no-auth to let any process that reaches the "
                "port drive the executor")
    log.warning("--insecure-no-auth: any process that reaches %s:%d can reset the executor and "
                "send it plans", config.host, config.port)
    return []


def _refuse(reason: str) -> None:
    """Ends start-up: one line on stderr, exit status 1, no traceback (SystemExit). Nobody
    awaits a task that SystemExit stopped, so its exception is read here, or asyncio would
    log it with a traceback when the task is collected."""
    task = asyncio.current_task()
    if task is not None:
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
    raise SystemExit(f"llmserve-executor: error: {reason}")


async def _serve_until_stopped(config: ExecutorConfig) -> None:
    """serve(), but a SIGINT/SIGTERM during start-up exits at once: the model loads in a thread
    that cannot be interrupted, and the interpreter would wait for it before exiting."""
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    ready = asyncio.Event()
    serving = asyncio.create_task(serve(config, on_ready=lambda port: ready.set(), stop=stop))
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait([serving, stopping], return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not serving.done() and not ready.is_set():
        log.info("stopped during start-up")
        logging.shutdown()
        os._exit(0)
    await serving  # serving: serve() drains and stops by itself


def main(argv: list[str] | None = None) -> None:
    """Console entry point: llmserve-executor [flags] (also python -m executor_svc).
    SIGTERM and Ctrl-C stop it with exit 0 and no traceback, during start-up too."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # until the loop's handlers take over
    configure_logging("INFO", "executor")  # the one format of every llmserve process (llmserve/logs.py)
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    try:
        run(_serve_until_stopped(ExecutorConfig.from_args(argv)))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
