"""The engine core process: the scheduler core and the executor stream, alone on one interpreter.

It exists as a process of its own because the public API streams one gRPC message per request
per step: in one interpreter those hundreds of streams held the GIL while the step loop waited
to send the next plan, and the GPU idled. Here the step loop never waits behind a client.
It talks to the API process over one duplex pipe; scheduler_svc/messages.py lists what crosses.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import astuple
from multiprocessing.connection import Connection

from scheduler_svc.config import SchedulerConfig
from scheduler_svc.core.outputs import RequestOutput
from scheduler_svc.core.request import Request
from scheduler_svc.core.scheduler import Scheduler, SchedulerCoreConfig, StepResultError
from scheduler_svc.core.tokenizer import Tokenizer
from scheduler_svc.engine.executor_client import ExecutorClient, ExecutorUnavailable
from scheduler_svc.engine.step_loop import StepLoop
from scheduler_svc.messages import (ALL, AbortRequest, AddRequest, CoreStats, Failed, Outputs, Ready,
                                    RequestError, encode_output)
from scheduler_svc.runtime import configure_logging, run_async
from step_protocol.domain import ExecutorInfo, StepResult

log = logging.getLogger("llmserve.engine_core")


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


class EngineCore:
    """The step loop over one executor connection, fed by the API process's commands."""

    def __init__(self, config: SchedulerConfig, conn: Connection):
        self._config = config
        self._conn = conn
        self._client = ExecutorClient(config.executor_address)
        self._tokenizers: dict[str, Tokenizer] = {}
        self._wake = asyncio.Event()
        self._connected = False  # False while (re)connecting: new requests are refused
        self.stats = CoreStats()
        self.scheduler: Scheduler | None = None
        self.loop: StepLoop | None = None

    async def connect(self) -> ExecutorInfo:
        """Handshakes with the executor and sizes a fresh scheduler core from its answer."""
        info = await self._client.connect(self._config.executor_connect_timeout)
        path = self._config.tokenizer or info.model_path
        if path not in self._tokenizers:
            self._tokenizers[path] = Tokenizer.from_pretrained(path)
        self.scheduler = Scheduler(core_config(self._config, info), self._tokenizers[path])
        self.loop = StepLoop(self.scheduler, self._client, depth=2 if self._config.overlap else 1,
                             on_outputs=self._publish, on_result=self._record)
        self._connected = True
        return info

    def on_readable(self) -> None:
        """Commands from the API process (called by the loop when the pipe has data)."""
        while self._conn.poll():
            try:
                cmd = self._conn.recv()
            except EOFError:  # the API process is gone
                asyncio.get_running_loop().stop()
                return
            if isinstance(cmd, AddRequest):
                self._add(Request(cmd.req_id, cmd.prompt_token_ids, cmd.params))
            elif isinstance(cmd, AbortRequest):
                self.scheduler.abort_request(cmd.req_id)
        self._publish()
        self._wake.set()

    def _add(self, request: Request) -> None:
        if not self._connected:
            self._publish(errors=[(request.req_id, RequestError(
                "UNAVAILABLE", "the executor is unreachable; the server is reconnecting, retry later"))])
            return
        try:
            self.scheduler.add_request(request)
        except ValueError as e:  # validation let through a request the core can never run
            self._publish(errors=[(request.req_id, RequestError("INVALID_ARGUMENT", str(e)))])

    def _publish(self, outputs: list[RequestOutput] = (), errors: list = ()) -> None:
        s, sched = self.stats, self.scheduler
        s.num_total_blocks, s.num_free_blocks = sched.num_total_blocks, sched.num_free_blocks
        s.num_running, s.num_waiting = sched.num_running, sched.num_waiting
        self._conn.send(Outputs([encode_output(o) for o in outputs], list(errors), astuple(s)))

    def _record(self, result: StepResult) -> None:
        s = self.stats
        s.num_steps += 1
        s.prepare_us += result.prepare_us
        s.forward_us += result.forward_us
        s.sample_us += result.sample_us
        s.num_graph_steps += result.graph_size > 0

    async def run(self) -> None:
        """Steps while there is work, sleeps until a command arrives; reconnects when the
        executor goes away."""
        while True:
            try:
                await self._run_steps()
            except (ExecutorUnavailable, StepResultError) as e:
                log.error("executor lost or out of step: %s; failing every request and reconnecting", e)
                self._connected = False
                self._publish(errors=[(ALL, RequestError("UNAVAILABLE", f"the executor went away: {e}"))])
                await self.connect()
                log.info("executor reconnected")

    async def _run_steps(self) -> None:
        while True:
            if await self.loop.step():
                continue
            self._wake.clear()
            if not self.scheduler.has_work():
                await self._wake.wait()
            else:
                # Work exists but nothing could be scheduled: wait for a change, not a spin.
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=0.05)
                except asyncio.TimeoutError:
                    pass


async def _core_main(config: SchedulerConfig, conn: Connection) -> None:
    core = EngineCore(config, conn)
    try:
        info = await core.connect()
    except Exception as e:  # noqa: BLE001 - reported to the API process
        conn.send(Failed(f"{type(e).__name__}: {e}"))
        return
    conn.send(Ready(info))
    core._publish()  # the status RPC has real figures before the first request
    asyncio.get_running_loop().add_reader(conn.fileno(), core.on_readable)
    await core.run()


def core_process_main(config: SchedulerConfig, conn: Connection) -> None:
    """Entry point of the engine core process."""
    # Ctrl-C reaches the whole process group: the API process decides when the core stops
    # (it terminates the core, or the core sees the pipe close).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging(config.log_level, "engine-core")
    try:
        run_async(_core_main(config, conn))
    except (KeyboardInterrupt, RuntimeError):  # stopped with the API process
        pass
