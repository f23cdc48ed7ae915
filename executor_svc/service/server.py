"""Executor process: load the model, start the gRPC endpoint (a child process: endpoint.py), then
run the steps on two threads of this process (step_threads.py) over the link to it (link.py)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from executor_svc.config import ExecutorConfig
from executor_svc.service import link
from llmserve.heap import freeze_startup_heap
from llmserve.logs import configure_logging

log = logging.getLogger("executor_svc")
STOP_GRACE_S = 5.0  # for the open plan stream to end when the service stops


async def serve(config: ExecutorConfig, on_ready: Callable[[int], None] | None = None,
                stop: asyncio.Event | None = None) -> None:
    """Runs until `stop` is set (or SIGINT/SIGTERM); on_ready(bound_port) once serving. Without an
    internal token (and without insecure_no_auth), or for a model that cannot be served
    (model_checks), raises SystemExit with one line saying why, before anything is served; when
    the endpoint process or another rank ends, SystemExit too (status 1). This loop does no
    step work: it waits, and starts and stops the endpoint."""
    from executor_svc.model_loader.checks import ModelError
    from executor_svc.service.endpoint import EndpointProcess
    from executor_svc.service.step_threads import StepThreads
    from executor_svc.startup.build import build_runner
    from step_protocol import codec

    _check_auth(config)
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            pass
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="executor-step")  # builds, launches
    waiter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="executor-wait")  # finishes
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
    failure: list[str] = []  # why the service ends by itself (another rank, the endpoint)

    def on_failure(reason: str) -> None:  # from the ranks' watchdog thread
        failure.append(reason)
        loop.call_soon_threadsafe(stop.set)

    runner.watch(on_failure)
    info = runner.info()
    log.info("ready in %.1f s: model %s, %d KV blocks of %d tokens, graphs %s",
             time.perf_counter() - t0, info.model_name, info.num_blocks, info.block_size,
             list(info.cuda_graph_sizes) or "off (eager)")
    freeze_startup_heap(log)  # (the model, graphs and warm-up garbage: llmserve/heap.py)
    endpoint = EndpointProcess.start(config, codec.info_to_pb(info).SerializeToString())
    try:
        port = await loop.run_in_executor(worker, endpoint.wait_ready)
    except EOFError:
        code = await loop.run_in_executor(None, endpoint.wait, 5.0)
        runner.close()
        _refuse(f"the gRPC endpoint process exited with status {code} before serving")
    steps = StepThreads(runner, endpoint.link)
    launches = loop.run_in_executor(worker, steps.run_launches)  # the thread that built the runner
    finishes = loop.run_in_executor(waiter, steps.run_finishes)
    log.info("serving on %s:%d (endpoint process %d)", config.host, port, endpoint.proc.pid)
    if on_ready is not None:
        on_ready(port)
    stopping = asyncio.ensure_future(stop.wait())
    alive = asyncio.ensure_future(_heartbeat(endpoint))
    await asyncio.wait([stopping, launches], return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    alive.cancel()
    if launches.done() and not failure:  # the link ended, and not by our word
        failure.append(await _endpoint_ended(launches, endpoint))
    log.info("stopping")
    endpoint.stop(0 if failure else STOP_GRACE_S)  # health NOT_SERVING, the open stream ends
    await loop.run_in_executor(None, endpoint.wait, STOP_GRACE_S + 5.0)  # then: end of file
    if failure and not launches.done():  # a step may wait on the dead rank: leave it (launch.py exits)
        worker.shutdown(wait=False, cancel_futures=True)
        waiter.shutdown(wait=False)
        _refuse(failure[0])
    await asyncio.gather(launches, finishes, return_exceptions=True)
    worker.shutdown(wait=True)
    waiter.shutdown(wait=True)
    endpoint.link.close()
    runner.close()  # the other ranks of a tensor-parallel executor, if any
    if failure:
        _refuse(failure[0])


async def _heartbeat(endpoint) -> None:
    """The alive frames: Handshake calls are answered only while this process runs (link.py)."""
    while not endpoint.link.broken:
        endpoint.link.send_nowait(link.ALIVE)
        await asyncio.sleep(link.HEARTBEAT_S)


async def _endpoint_ended(launches: asyncio.Future, endpoint) -> str:
    """Why the link ended by itself: the endpoint process's exit (or a frame not of the link). A
    killed endpoint ends the link with end of file or, with frames unread, a connection reset:
    both are its exit."""
    exc = launches.exception()
    if exc is not None and not isinstance(exc, OSError):  # (ConnectionResetError is an OSError)
        return f"the link to the gRPC endpoint process broke: {exc}"
    code = await asyncio.get_running_loop().run_in_executor(None, endpoint.wait, 5.0)
    return f"the gRPC endpoint process exited with status {code}"


def _check_auth(config: ExecutorConfig) -> None:
    """No token and no insecure_no_auth: SystemExit (an executor anyone local can drive must be
    asked for). The endpoint process checks the token on every call but grpc.health.v1."""
    if config.internal_token:
        return
    if not config.insecure_no_auth:
        _refuse("no internal token: set LLMSERVE_INTERNAL_TOKEN (or --internal-token) to the secret "
                "the scheduler sends, or pass --insecure-no-auth to let any process that reaches the "
                "port drive the executor")
    log.warning("--insecure-no-auth: any process that reaches %s:%d can reset the executor and "
                "send it plans", config.host, config.port)


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
