"""The engine core process: the scheduler core and the executor stream, alone on one interpreter.

It exists as a process of its own because the public API streams one gRPC message per request
per step: in one interpreter those hundreds of streams held the GIL while the step loop waited
to send the next plan, and the GPU idled. Here the step loop never waits behind a client.
It talks to the API process over one framed channel (scheduler_svc/pipe.py) on a socket it
inherits; scheduler_svc/messages.py lists what crosses. It lives exactly as long as the API
process: it stops when the channel closes, and on Linux the kernel kills it with its parent.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket

from llmserve.heap import freeze_startup_heap
from llmserve.logs import configure_logging
from llmserve.speculative import parse_speculative_config
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.core.outputs import RequestOutput
from scheduler_svc.core.scheduler import Scheduler, SchedulerCoreConfig, StepResultError
from scheduler_svc.core.spec.decoder import check_executor
from scheduler_svc.core.tokenizer import Tokenizer
from scheduler_svc.engine.containment import add_all_or_none, request_failed, send_or_fail, with_failed
from scheduler_svc.engine.executor_client import ExecutorClient, ExecutorUnavailable
from scheduler_svc.engine.stats import EngineStats, StatsLogger
from scheduler_svc.engine.step_loop import StepLoop
from llmserve.lifetime import die_with_parent
from scheduler_svc.messages import (ALL, AbortRequest, AddRequest, CoreStats, Failed, Outputs, Ready,
                                    RequestError, encode_output, stats_tuple)
from scheduler_svc.pipe import Channel, ChannelClosed
from scheduler_svc.runtime import run_async
from step_protocol.domain import ExecutorInfo

log = logging.getLogger("llmserve.engine_core")


def core_config(config: SchedulerConfig, info: ExecutorInfo) -> SchedulerCoreConfig:
    """The scheduler core's limits: the executor's, optionally lowered by flags. ValueError
    when the speculation asked for does not match the executor (core/spec/decoder.check_executor)."""
    speculative = parse_speculative_config(config.speculative_config)
    check_executor(speculative, info)

    def lower(flag: int, executor_value: int) -> int:
        return min(flag, executor_value) if flag > 0 else executor_value

    return SchedulerCoreConfig(
        num_blocks=info.num_blocks, block_size=info.block_size,
        max_num_seqs=lower(config.max_num_seqs, info.max_num_seqs),
        max_num_batched_tokens=lower(config.max_num_batched_tokens, info.max_num_batched_tokens),
        max_model_len=info.max_model_len,
        long_prefill_token_threshold=config.long_prefill_token_threshold,
        eos_token_ids=tuple(info.eos_token_ids),
        enable_prefix_caching=config.enable_prefix_caching,
        speculative=speculative,
    )


class EngineCore:
    """The step loop over one executor connection, fed by the API process's commands."""

    def __init__(self, config: SchedulerConfig, channel: Channel):
        self._config = config
        self._channel = channel
        self._publish_pending = False  # a load snapshot is due once this batch of commands is read
        self._client = ExecutorClient(config.executor_address, config.internal_token,
                                      step_timeout=config.executor_step_timeout)
        self._tokenizers: dict[str, Tokenizer] = {}
        self._wake = asyncio.Event()
        self._connected = False  # False while (re)connecting: new requests are refused
        self.stats = CoreStats()
        self.engine_stats = EngineStats(self.stats)  # step times, preemptions, scheduled-at times
        self.scheduler: Scheduler | None = None
        self.loop: StepLoop | None = None

    async def connect(self) -> ExecutorInfo:
        """Handshakes with the executor (waiting up to --executor-connect-timeout for it to come
        up) and sizes a fresh scheduler core from its answer."""
        return await self._connect(self._config.executor_connect_timeout)

    async def _connect(self, timeout: float) -> ExecutorInfo:
        info = await self._client.connect(timeout)
        path = self._config.tokenizer or info.model_path
        if path not in self._tokenizers:
            self._tokenizers[path] = await asyncio.to_thread(Tokenizer.from_pretrained, path)  # off the loop
        self.scheduler = Scheduler(core_config(self._config, info), self._tokenizers[path])
        depth = self._config.pipeline_depth if self._config.overlap else 1
        self.loop = StepLoop(self.scheduler, self._client, depth, on_outputs=self._publish,
                             on_result=self.engine_stats.on_result, on_plan=self.engine_stats.on_plan,
                             timings=self.engine_stats.loop_timings)
        self._connected = self.stats.executor_available = True
        return info

    async def reconnect(self) -> None:
        """Retries the handshake until the executor answers again (a restarted or resumed
        executor); meanwhile new requests get UNAVAILABLE and health says NOT_SERVING."""
        attempt = 0
        while True:
            try:
                await self._connect(self._config.executor_health_interval)
                log.info("executor reconnected")
                self._publish()
                return
            except ExecutorUnavailable as e:
                if attempt % 20 == 0:
                    log.warning("executor still unavailable (%s); retrying", e)
                attempt += 1
                await asyncio.sleep(0.25)

    def _lose_executor(self, reason: Exception, error: RequestError | None = None) -> None:
        """Fails every request and forgets them: their rows on the executor are gone too (the
        reconnection's Reset drops them)."""
        if error is None:
            log.error("executor lost or out of step: %s; failing every request and reconnecting", reason)
            error = RequestError("UNAVAILABLE", f"the executor went away: {reason}")
        self._connected = self.stats.executor_available = False
        self.scheduler, self.loop = None, None
        self._publish(errors=[(ALL, error)])

    async def serve(self) -> None:
        """Handshakes, reports Ready (or Failed) to the API process, then steps."""
        try:
            info = await self.connect()
        except Exception as e:  # noqa: BLE001 - reported to the API process
            await self._channel.send(Failed(f"{type(e).__name__}: {e}"))
            return
        await self._channel.send(Ready(info))
        freeze_startup_heap(log)
        self._publish()  # the status RPC has real figures before the first request
        await self.run()

    async def read_commands(self) -> None:
        """Commands from the API process, until it closes the channel (ChannelClosed).
        Never waits for its own writes (pipe.py says why): replies go out with send_nowait."""
        while True:
            cmd = await self._channel.recv()
            if isinstance(cmd, AddRequest):
                self._add(cmd)
            elif isinstance(cmd, AbortRequest) and self.scheduler is not None:
                try:
                    self.scheduler.abort_request(cmd.req_id)
                except Exception:  # noqa: BLE001 - one request's trouble; the core carries on
                    log.exception("request %d: aborting it failed", cmd.req_id)
            self._wake.set()
            if not self._publish_pending:  # one snapshot per batch of commands read together
                self._publish_pending = True
                asyncio.get_running_loop().call_soon(self._publish_snapshot)

    def _publish_snapshot(self) -> None:
        self._publish_pending = False
        try:
            self._publish()
        except ChannelClosed:
            pass  # the reader sees the close too and ends the process

    def _add(self, cmd: AddRequest) -> None:
        """Adds the samples of one client request, all or none; anything this request makes
        raise fails this request only."""
        if self._connected:
            error = add_all_or_none(self.scheduler, cmd)
        else:
            error = RequestError("UNAVAILABLE", "the executor is unreachable; the server is "
                                 "reconnecting, retry later")
        if error is not None:
            self._publish(errors=[(i, error) for i in range(cmd.req_id, cmd.req_id + max(1, cmd.params.n))])

    def _publish(self, outputs: list[RequestOutput] = (), errors: list = ()) -> None:
        """Sends outputs and errors with a load snapshot. Never waits: the step loop waits for
        the channel between steps (run_steps), so a stalled API process holds the steps back."""
        s, sched = self.stats, self.scheduler
        if sched is not None:
            outputs, errors = with_failed(sched, outputs, errors)  # requests the update failed alone
            s.num_total_blocks, s.num_free_blocks = sched.num_total_blocks, sched.num_free_blocks
            s.num_running, s.num_waiting = sched.num_running, sched.num_waiting
            num_queries, num_hits = sched.take_prefix_cache_stats()  # totals survive a reconnect
            s.prefix_cache_queries += num_queries
            s.prefix_cache_hits += num_hits
            num_drafts, num_draft_tokens, num_accepted = sched.take_spec_decode_stats()
            s.spec_decode_num_drafts += num_drafts
            s.spec_decode_num_draft_tokens += num_draft_tokens
            s.spec_decode_num_accepted_tokens += num_accepted
        else:  # no executor: nothing runs, nothing is held
            s.num_total_blocks = s.num_free_blocks = s.num_running = s.num_waiting = 0
        self.engine_stats.on_outputs(outputs)
        scheduled = self.engine_stats.take_scheduled()
        stats = stats_tuple(s)
        try:
            self._channel.send_nowait(Outputs([encode_output(o) for o in outputs], list(errors), stats,
                                              scheduled))
        except ChannelClosed:
            raise
        except Exception:  # noqa: BLE001 - too large together, or one does not encode: each alone
            if scheduled:
                self._channel.send_nowait(Outputs([], [], stats, scheduled))
            for o in outputs:
                send_or_fail(self._channel, self.scheduler, o.req_id,
                             lambda o=o: Outputs([encode_output(o)], [], stats), stats)
            for req_id, error in errors:
                send_or_fail(self._channel, self.scheduler, req_id,
                             lambda e=(req_id, error): Outputs([], [e], stats), stats)

    async def run(self) -> None:
        """Steps while there is work, sleeps until a command arrives; reconnects when the
        executor goes away, is hung (no result within --executor-step-timeout) or does not
        answer an idle ping (--executor-health-interval)."""
        while True:
            try:
                await self._run_steps()
            except (ExecutorUnavailable, StepResultError) as e:
                self._lose_executor(e)
            except ChannelClosed:
                raise
            except Exception as e:  # noqa: BLE001 - the scheduler's own state is in doubt
                # A fault no single request explains (containment.py handles those that one does):
                # every request fails, and a fresh scheduler over a Reset executor takes over.
                error = request_failed(ALL, "stepping (every request fails; the scheduler restarts)", e)
                self._lose_executor(e, error)
            await self.reconnect()

    async def _run_steps(self) -> None:
        interval = self._config.executor_health_interval
        while True:
            await self._channel.drain()  # back-pressure: the API process is not far behind
            if await self.loop.step():
                continue
            self._wake.clear()
            if not self.scheduler.has_work():
                try:  # idle: wake for a command, or ping the executor now and then
                    await asyncio.wait_for(self._wake.wait(), timeout=interval)
                except asyncio.TimeoutError:
                    await self._client.ping(interval)
            else:
                # Work exists but nothing could be scheduled: wait for a change, not a spin.
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=0.05)
                except asyncio.TimeoutError:
                    pass


async def _core_main(sock: socket.socket, max_frame_bytes: int) -> None:
    channel = await Channel.open(sock, max_frame_bytes)
    try:
        config: SchedulerConfig = await channel.recv()  # the API process's first frame
    except ChannelClosed:
        return
    configure_logging(config.log_level, "engine-core")
    core = EngineCore(config, channel)
    stats_line = asyncio.create_task(StatsLogger(core.engine_stats, config.log_stats_interval).run())
    tasks = {asyncio.create_task(core.serve()), asyncio.create_task(core.read_commands())}
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    stats_line.cancel()
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    await channel.aclose()  # flushes what is written (a Failed) before the process ends
    for task in done:
        if isinstance(task.exception(), ChannelClosed):
            log.info("the API process closed the channel; stopping")
        elif task.exception() is not None:
            raise task.exception()


def command_line(fd: int, max_frame_bytes: int, parent_pid: int) -> list[str]:
    """The arguments main() reads (api/engine_client.py starts the process with them)."""
    return ["--fd", str(fd), "--max-frame-bytes", str(max_frame_bytes), "--parent-pid", str(parent_pid)]


def main(argv: list[str] | None = None) -> None:
    """Entry point of the engine core process: its channel is the inherited socket `--fd`."""
    p = argparse.ArgumentParser(prog="llmserve-engine-core")
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--max-frame-bytes", type=int, required=True)
    p.add_argument("--parent-pid", type=int, required=True)
    args = p.parse_args(argv)
    # Ctrl-C and a SIGTERM to the process group reach this process too: the API process
    # decides when the core stops (it closes the channel), so that it can drain first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    die_with_parent(signal.SIGKILL, args.parent_pid)  # even a SIGKILLed parent takes the core along
    run_async(_core_main(socket.socket(fileno=args.fd), args.max_frame_bytes))


if __name__ == "__main__":
    main()
