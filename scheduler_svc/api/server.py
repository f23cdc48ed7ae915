"""Scheduler process: connects to the executor, then serves the public API on a grpc.aio server."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from protos.llmserve.v1 import llmserve_pb2 as pb
from protos.llmserve.v1 import llmserve_pb2_grpc as pb_grpc
from scheduler_svc.api.engine_client import EngineClient
from scheduler_svc.api.servicer import LLMServeServicer
from scheduler_svc.config import SchedulerConfig, from_args
from scheduler_svc.core.tokenizer import Tokenizer
from scheduler_svc.engine.executor_client import CHANNEL_OPTIONS
from scheduler_svc.runtime import configure_logging, run_async

log = logging.getLogger("llmserve.scheduler")
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["LLMServe"].full_name


async def serve(config: SchedulerConfig) -> bool:
    """Serves until SIGINT/SIGTERM (returns True) or until the engine core dies (False)."""
    engine = EngineClient(config)
    log.info("waiting for the executor at %s", config.executor_address)
    info = await engine.start()
    log.info("executor ready: model %s, %d KV blocks of %d tokens, max_model_len %d, graphs %s",
             info.model_name, info.num_blocks, info.block_size, info.max_model_len,
             list(info.cuda_graph_sizes) or "off")
    tokenizer = Tokenizer.from_pretrained(config.tokenizer or info.model_path)

    server = grpc.aio.server(options=CHANNEL_OPTIONS)
    pb_grpc.add_LLMServeServicer_to_server(
        LLMServeServicer(engine, tokenizer, info.model_name, config.max_waiting), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
         reflection.SERVICE_NAME), server)
    address = f"{config.host}:{config.port}"
    if server.add_insecure_port(address) == 0:
        raise SystemExit(f"cannot bind {address}")
    await server.start()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    if config.metrics_port:
        from scheduler_svc.api.metrics import start_metrics

        start_metrics(config.metrics_port, engine)
    log.info("serving llmserve.v1.LLMServe on %s", address)

    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await asyncio.wait([asyncio.create_task(stop.wait()), asyncio.create_task(engine.core_lost.wait())],
                       return_when=asyncio.FIRST_COMPLETED)
    log.info("shutting down")
    await health_servicer.enter_graceful_shutdown()
    await server.stop(grace=2.0)
    engine.stop()
    return not engine.core_lost.is_set()


def main(argv: list[str] | None = None) -> None:
    config = from_args(argv)
    configure_logging(config.log_level, "scheduler")
    if not run_async(serve(config)):
        sys.exit("the engine core process exited")


if __name__ == "__main__":
    main()
