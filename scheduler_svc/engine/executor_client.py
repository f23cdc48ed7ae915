"""The scheduler's connection to the executor: handshake, reset and one long-lived step stream.

Plans are written by a writer task of their own: grpc.aio's stream.write() returns only once
the message has gone through gRPC's completion queue (a hop through its poller thread), which
took ~0.8-1.6 ms a plan of W3 while encoding it took ~0.1 ms; send() only encodes and queues,
so the step loop applies the previous result meanwhile. Plans still go out one at a time, in
order; a failed write fails the next send() or receive().
"""

from __future__ import annotations

import asyncio

import grpc

from protos.llmserve.executor.v1 import executor_pb2 as epb
from protos.llmserve.executor.v1 import executor_pb2_grpc as epb_grpc
from step_protocol import codec
from step_protocol.domain import ExecutorInfo, StepPlan, StepResult

MAX_MESSAGE_BYTES = 64 << 20
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Reconnect within a second of the executor coming (back) up: gRPC's default back-off
    # grows to minutes, which delayed every start by seconds.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


MAX_UNSENT_PLANS = 16


class ExecutorUnavailable(Exception):
    """The executor cannot be reached or its step stream broke."""


class ExecutorClient:
    """Sends step plans and reads step results over one bidirectional stream, in order (the
    step loop's transport in the engine core); speaks domain types, converts at this edge."""

    def __init__(self, address: str, internal_token: str = "", step_timeout: float | None = None):
        self._address = address
        self._step_timeout = step_timeout  # seconds a result may take; None = no limit
        # the executor's credential, sent on every call; none = an --insecure-no-auth executor
        self._metadata = (("authorization", f"Bearer {internal_token}"),) if internal_token else None
        self._channel: grpc.aio.Channel | None = None
        self._stream = None
        self._writer: asyncio.Task | None = None  # writes the queued plans, in order
        self._plans: asyncio.Queue | None = None
        self._write_error: ExecutorUnavailable | None = None
        # step id -> (req_id, why) of the new requests send() left out: they did not encode
        self._unsent: dict[int, list[tuple[int, str]]] = {}

    async def connect(self, timeout: float) -> ExecutorInfo:
        """Waits for the executor, handshakes, drops any state it held, opens the stream."""
        await self.close()
        self._channel = grpc.aio.insecure_channel(self._address, options=CHANNEL_OPTIONS)
        stub = epb_grpc.ExecutorStub(self._channel)
        try:
            info = await stub.Handshake(epb.HandshakeRequest(), wait_for_ready=True, timeout=timeout,
                                        metadata=self._metadata)
            # Reset also ends a plan stream of ours the executor still holds open
            await stub.Reset(epb.ResetRequest(), timeout=timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as e:
            raise ExecutorUnavailable(f"executor at {self._address}: {e.details()}") from e
        self._stream = stub.Execute(metadata=self._metadata)
        # bounded: the step loop keeps at most --pipeline-depth (<= 8) plans unanswered
        self._plans, self._write_error = asyncio.Queue(maxsize=MAX_UNSENT_PLANS), None
        self._unsent = {}  # a fresh stream: no result of an older plan will come
        self._writer = asyncio.create_task(self._write_plans(self._stream, self._plans))
        return codec.info_from_pb(info)

    async def send(self, plan: StepPlan) -> None:
        """Queues the plan for the writer task (the step loop does not wait for the write).
        A new request whose values do not encode (codec.plan_to_pb_dropping) fails alone: the
        plan goes without it, and its step's result reports it in failed_req_ids, as the
        executor reports a row it refused."""
        if self._write_error is not None:
            raise self._write_error
        message, failed = codec.plan_to_pb_dropping(plan)
        if failed:
            self._unsent[plan.step_id] = failed
        self._plans.put_nowait(message)

    async def _write_plans(self, stream, plans: asyncio.Queue) -> None:
        while True:
            message = await plans.get()
            try:
                await stream.write(message)
            except (grpc.aio.AioRpcError, grpc.aio.UsageError) as e:
                self._write_error = ExecutorUnavailable(f"step stream broke while sending: {e}")
                return

    async def receive(self) -> StepResult:
        if self._write_error is not None:
            raise self._write_error
        try:
            result = await asyncio.wait_for(self._stream.read(), self._step_timeout)
        except asyncio.TimeoutError:
            raise ExecutorUnavailable(
                f"no step result for {self._step_timeout:g} s: the executor is hung") from None
        except grpc.aio.AioRpcError as e:
            raise ExecutorUnavailable(f"step stream broke: {e.details()}") from e
        if result is grpc.aio.EOF:
            raise ExecutorUnavailable("the executor closed the step stream")
        out = codec.result_from_pb(result)
        unsent = self._unsent.pop(out.step_id, None) if self._unsent else None  # (no work normally)
        if unsent:
            out.failed_req_ids += [req_id for req_id, _ in unsent]
            out.failed_errors += [why for _, why in unsent]
        return out

    async def ping(self, timeout: float) -> None:
        """Raises ExecutorUnavailable unless the executor answers a handshake within timeout."""
        stub = epb_grpc.ExecutorStub(self._channel)
        try:
            await stub.Handshake(epb.HandshakeRequest(), timeout=timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as e:
            raise ExecutorUnavailable(f"the executor did not answer a ping within {timeout:g} s: "
                                      f"{e.code().name}") from e

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            self._writer = None
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
