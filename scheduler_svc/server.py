"""Scheduler process: connects to the executor, then serves the public API on a grpc.aio server."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from protos.llmserve.v1 import llmserve_pb2 as pb
from protos.llmserve.v1 import llmserve_pb2_grpc as pb_grpc
from scheduler_svc.config import SchedulerConfig, from_args
from scheduler_svc.engine import Engine
from scheduler_svc.executor_client import CHANNEL_OPTIONS, ExecutorClient
from scheduler_svc.scheduler import Scheduler, SchedulerCoreConfig
from scheduler_svc.servicer import LLMServeServicer
from scheduler_svc.tokenizer import Tokenizer
from scheduler_svc.wire import ExecutorInfo

log = logging.getLogger("llmserve.scheduler")
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["LLMServe"].full_name


def core_config(config: SchedulerConfig, info: ExecutorInfo) -> SchedulerCoreConfig:
    """The scheduler core's limits: the executor's, optionally lowered by flags."""
    def lower(flag: int, executor_value: int) -> int:
        return min(flag, executor_value) if flag > 0 else executor_value

    return SchedulerCoreConfig(
        num_blocks=info.num_blocks, block_size=info.block_size,
        max_num_seqs=lower(config.max_num_seqs, info.max_num_seqs),
        max_num_batched_tokens=lower(config.max_num_batched_tokens, info.max_num_batched_tokens),
        max_model_len=info.max_model_len,
        long_prefill_token_threshold=config.long_prefill_token_threshold,
        eos_token_ids=tuple(info.eos_token_ids),
    )


async def serve(config: SchedulerConfig) -> None:
    tokenizers: dict[str, Tokenizer] = {}

    def make_scheduler(info: ExecutorInfo) -> Scheduler:
        path = config.tokenizer or info.model_path
        if path not in tokenizers:
            tokenizers[path] = Tokenizer.from_pretrained(path)
        return Scheduler(core_config(config, info), tokenizers[path])

    engine = Engine(ExecutorClient(config.executor_address), make_scheduler,
                    overlap=config.overlap, connect_timeout=config.executor_connect_timeout,
                    stream_interval=config.stream_interval)
    log.info("waiting for the executor at %s", config.executor_address)
    info = await engine.start()
    log.info("executor ready: model %s, %d KV blocks of %d tokens, max_model_len %d, graphs %s",
             info.model_name, info.num_blocks, info.block_size, info.max_model_len,
             list(info.cuda_graph_sizes) or "off")
    tokenizer = tokenizers[config.tokenizer or info.model_path]

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
        from scheduler_svc.metrics import start_metrics

        start_metrics(config.metrics_port, engine)
    log.info("serving llmserve.v1.LLMServe on %s", address)

    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    await health_servicer.enter_graceful_shutdown()
    await server.stop(grace=2.0)
    engine.stop()


def run_async(main) -> None:
    """Runs a coroutine under uvloop when it is installed, plain asyncio otherwise."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


def main(argv: list[str] | None = None) -> None:
    config = from_args(argv)
    # The engine core thread must get the GIL promptly when a step result arrives, even while
    # the API thread is busy streaming: a shorter switch interval than the default 5 ms.
    sys.setswitchinterval(0.0005)
    logging.basicConfig(level=config.log_level.upper(),
                        format=f"%(asctime)s scheduler[{os.getpid()}] %(levelname)s %(name)s: %(message)s")
    run_async(serve(config))


if __name__ == "__main__":
    main()
