"""The scheduler's connection to the executor: handshake, reset and one long-lived step stream."""

from __future__ import annotations

import grpc

from protos.llmserve.executor.v1 import executor_pb2 as epb
from protos.llmserve.executor.v1 import executor_pb2_grpc as epb_grpc
from step_protocol import codec
from step_protocol.domain import ExecutorInfo, StepPlan, StepResult

MAX_MESSAGE_BYTES = 64 << 20
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]


class ExecutorUnavailable(Exception):
    """The executor cannot be reached or its step stream broke."""


class ExecutorClient:
    """Sends step plans and reads step results over one bidirectional stream, in order (the
    step loop's transport in the engine core); speaks domain types, converts at this edge."""

    def __init__(self, address: str):
        self._address = address
        self._channel: grpc.aio.Channel | None = None
        self._stream = None

    async def connect(self, timeout: float) -> ExecutorInfo:
        """Waits for the executor, handshakes, drops any state it held, opens the stream."""
        await self.close()
        self._channel = grpc.aio.insecure_channel(self._address, options=CHANNEL_OPTIONS)
        stub = epb_grpc.ExecutorStub(self._channel)
        try:
            info = await stub.Handshake(epb.HandshakeRequest(), wait_for_ready=True, timeout=timeout)
            await stub.Reset(epb.ResetRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as e:
            raise ExecutorUnavailable(f"executor at {self._address}: {e.details()}") from e
        self._stream = stub.Execute()
        return codec.info_from_pb(info)

    async def send(self, plan: StepPlan) -> None:
        try:
            await self._stream.write(codec.plan_to_pb(plan))
        except (grpc.aio.AioRpcError, grpc.aio.UsageError) as e:
            raise ExecutorUnavailable(f"step stream broke while sending: {e}") from e

    async def receive(self) -> StepResult:
        try:
            result = await self._stream.read()
        except grpc.aio.AioRpcError as e:
            raise ExecutorUnavailable(f"step stream broke: {e.details()}") from e
        if result is grpc.aio.EOF:
            raise ExecutorUnavailable("the executor closed the step stream")
        return codec.result_from_pb(result)

    async def close(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
