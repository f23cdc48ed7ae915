"""The engine core process: the scheduler core and the executor stream, alone on one interpreter.

It exists as a process of its own because the public API streams one gRPC message per request
per step: in one interpreter those hundreds of streams held the GIL while the step loop waited
to send the next plan, and the GPU idled. Here the step loop never waits behind a client.

It talks to the API process over one duplex pipe:
    API -> core:  ("add", req_id, prompt_token_ids, SamplingParams)  |  ("abort", req_id)
    core -> API:  ("ready", ExecutorInfo)  |  ("failed", message)  |
                  ("outputs", [encoded RequestOutput], [(req_id, EngineError)], CoreStats tuple)
Outputs cross as plain tuples (encode_output / decode_output): pickling 256 dataclasses took
~0.3 ms a step and unpickling ~0.4 ms; tuples take a seventh of that.
An "outputs" message is sent after every applied step and every command, so the API side's
load figures are never older than one step. req_id ALL addresses every request.

With overlap on, the loop keeps one step queued at the executor: it sends step N+1 before it
reads step N's result (decode rows carry no token ids; the executor feeds its own last sample).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections import deque
from dataclasses import astuple, dataclass
from multiprocessing.connection import Connection

from protos.llmserve.executor.v1 import executor_pb2 as epb
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.executor_client import ExecutorClient, ExecutorUnavailable
from scheduler_svc.request import Request
from scheduler_svc.scheduler import Scheduler, SchedulerCoreConfig, StepResultError
from scheduler_svc.request import FinishReason
from scheduler_svc.scheduler_output import RequestOutput, SchedulerOutput
from scheduler_svc.tokenizer import Tokenizer
from scheduler_svc.wire import ExecutorInfo, sampled_from_pb

log = logging.getLogger("llmserve.engine_core")
ALL = -1  # req_id of an item meant for every request


class EngineError(Exception):
    """A request failed inside the engine; `code` names the gRPC status to answer with."""

    def __init__(self, code: str, message: str):
        super().__init__(code, message)
        self.code = code
        self.message = message


@dataclass
class CoreStats:
    """Load and running totals, as of the last step (the status RPC and metrics read these)."""

    num_total_blocks: int = 0
    num_free_blocks: int = 0
    num_running: int = 0
    num_waiting: int = 0
    num_steps: int = 0
    num_graph_steps: int = 0
    prepare_us: int = 0
    forward_us: int = 0
    sample_us: int = 0


def encode_output(o: RequestOutput) -> tuple:
    return (o.req_id, o.new_token_ids, o.new_text, o.finish_reason and o.finish_reason.value,
            o.matched_stop, o.num_prompt_tokens, o.num_output_tokens)


def decode_output(t: tuple) -> RequestOutput:
    req_id, token_ids, text, reason, matched, num_prompt, num_output = t
    return RequestOutput(req_id, token_ids, text, reason and FinishReason(reason), matched,
                         num_prompt, num_output)


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
    """The step loop over one executor connection."""

    def __init__(self, config: SchedulerConfig, conn: Connection):
        self._config = config
        self._conn = conn
        self._client = ExecutorClient(config.executor_address)
        self._depth = 2 if config.overlap else 1
        self._inflight: deque[SchedulerOutput] = deque()
        self._tokenizers: dict[str, Tokenizer] = {}
        self._wake = asyncio.Event()
        self._connected = False  # False while (re)connecting: new requests are refused
        self.stats = CoreStats()
        self.scheduler: Scheduler | None = None

    async def connect(self) -> ExecutorInfo:
        """Handshakes with the executor and sizes a fresh scheduler core from its answer."""
        info = await self._client.connect(self._config.executor_connect_timeout)
        path = self._config.tokenizer or info.model_path
        if path not in self._tokenizers:
            self._tokenizers[path] = Tokenizer.from_pretrained(path)
        self.scheduler = Scheduler(core_config(self._config, info), self._tokenizers[path])
        self._inflight.clear()
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
            if cmd[0] == "add":
                _, req_id, prompt, params = cmd
                self._add(Request(req_id, prompt, params))
            else:
                self.scheduler.abort_request(cmd[1])
        self._publish()
        self._wake.set()

    def _add(self, request: Request) -> None:
        if not self._connected:
            self._publish(errors=[(request.req_id, EngineError(
                "UNAVAILABLE", "the executor is unreachable; the server is reconnecting, retry later"))])
            return
        try:
            self.scheduler.add_request(request)
        except ValueError as e:  # validation let through a request the core can never run
            self._publish(errors=[(request.req_id, EngineError("INVALID_ARGUMENT", str(e)))])

    def _publish(self, outputs: list[RequestOutput] = (), errors: list = ()) -> None:
        s, sched = self.stats, self.scheduler
        s.num_total_blocks, s.num_free_blocks = sched.num_total_blocks, sched.num_free_blocks
        s.num_running, s.num_waiting = sched.num_running, sched.num_waiting
        self._conn.send(("outputs", [encode_output(o) for o in outputs], errors, astuple(s)))

    async def run(self) -> None:
        """The step loop; reconnects when the executor goes away."""
        while True:
            try:
                await self._step_loop()
            except (ExecutorUnavailable, StepResultError) as e:
                log.error("executor lost or out of step: %s; failing every request and reconnecting", e)
                self._connected = False
                self._publish(errors=[(ALL, EngineError("UNAVAILABLE", f"the executor went away: {e}"))])
                await self.connect()
                log.info("executor reconnected")

    async def _step_loop(self) -> None:
        while True:
            if len(self._inflight) < self._depth and self.scheduler.has_work():
                out = self.scheduler.schedule()
                if out.new_requests or out.cached_requests or out.finished_req_ids or out.preempted_req_ids:
                    await self._client.send(out)
                    self._inflight.append(out)
                    continue
            if self._inflight:
                self._apply(await self._client.receive())
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

    def _apply(self, result: epb.StepResult) -> None:
        out = self._inflight.popleft()
        if result.step_id != out.step_id:
            raise ExecutorUnavailable(f"result for step {result.step_id}, expected {out.step_id}")
        self._record(result)
        if not result.error:
            self._publish(self.scheduler.update_from_output(out, sampled_from_pb(result)))
            return
        log.error("step %d failed on the executor: %s", out.step_id, result.error)
        error = EngineError("INTERNAL", f"the executor failed the step: {result.error}")
        for req_id in out.scheduled_req_ids:
            self.scheduler.abort_request(req_id)  # before the update: their tokens are not coming
        self.scheduler.update_from_output(out, {})
        self._publish(errors=[(req_id, error) for req_id in out.scheduled_req_ids])

    def _record(self, result: epb.StepResult) -> None:
        s = self.stats
        s.num_steps += 1
        s.prepare_us += result.prepare_us
        s.forward_us += result.forward_us
        s.sample_us += result.sample_us
        s.num_graph_steps += result.graph_size > 0


async def _core_main(config: SchedulerConfig, conn: Connection) -> None:
    core = EngineCore(config, conn)
    try:
        info = await core.connect()
    except Exception as e:  # noqa: BLE001 - reported to the API process
        conn.send(("failed", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", info))
    core._publish()  # the status RPC has real figures before the first request
    asyncio.get_running_loop().add_reader(conn.fileno(), core.on_readable)
    await core.run()


def core_process_main(config: SchedulerConfig, conn: Connection) -> None:
    """Entry point of the engine core process."""
    from scheduler_svc.server import configure_logging, run_async

    # Ctrl-C reaches the whole process group: the API process decides when the core stops
    # (it terminates the core, or the core sees the pipe close).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging(config.log_level, "engine-core")
    try:
        run_async(_core_main(config, conn))
    except (KeyboardInterrupt, RuntimeError):  # stopped with the API process
        pass
