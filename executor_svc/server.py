"""Executor process: load the model, then serve the executor API, health and reflection."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from executor_svc.config import ExecutorConfig

log = logging.getLogger("executor_svc")
MAX_MESSAGE_BYTES = 64 << 20
GRPC_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]


async def serve(config: ExecutorConfig, on_ready: Callable[[int], None] | None = None,
                stop: asyncio.Event | None = None) -> None:
    """Runs until `stop` is set (or SIGINT/SIGTERM); on_ready(bound_port) once serving.
    All grpc objects are created inside this running loop."""
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection

    from executor_svc.servicer import ExecutorServicer
    from executor_svc.startup import build_runner
    from protos.llmserve.executor.v1 import executor_pb2, executor_pb2_grpc

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
    runner = await loop.run_in_executor(worker, build_runner, config)  # the loop stays responsive
    info = runner.info()
    log.info("ready in %.1f s: model %s, %d KV blocks of %d tokens, graphs %s",
             time.perf_counter() - t0, info.model_name, info.num_blocks, info.block_size,
             list(info.cuda_graph_sizes) or "off (eager)")

    server = grpc.aio.server(options=GRPC_OPTIONS)
    executor_pb2_grpc.add_ExecutorServicer_to_server(ExecutorServicer(runner, worker, waiter), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    service = executor_pb2.DESCRIPTOR.services_by_name["Executor"].full_name
    reflection.enable_server_reflection((service, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    port = server.add_insecure_port(f"{config.host}:{config.port}")
    await server.start()
    for name in (service, ""):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("serving on %s:%d", config.host, port)
    if on_ready is not None:
        on_ready(port)
    await stop.wait()
    log.info("stopping")
    await health_servicer.enter_graceful_shutdown()
    await server.stop(grace=5.0)
    worker.shutdown(wait=True)
    waiter.shutdown(wait=True)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: llmserve-executor [flags] (also python -m executor_svc)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = ExecutorConfig.from_args(argv)
    try:
        import uvloop

        uvloop.run(serve(config))
    except ImportError:
        asyncio.run(serve(config))


if __name__ == "__main__":
    main()
