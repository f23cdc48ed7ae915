"""The wire guards of the public servicer on a real grpc.aio server: malformed bytes get
INVALID_ARGUMENT, an unexpected exception or an engine INTERNAL error gets INTERNAL with an
error id and none of its text (the text and traceback go to the log)."""

import asyncio
import logging

import grpc
import pytest

from protos.llmserve.v1 import llmserve_pb2 as pb
from protos.llmserve.v1 import llmserve_pb2_grpc as pb_grpc
from scheduler_svc.api.grpc.handlers import abort_with, add_llmserve_servicer
from scheduler_svc.messages import RequestError

SECRET = "secret internal detail /srv/models/llama"


class Failing(pb_grpc.LLMServeServicer):
    """Fails the way a bug would: after a message, or before any."""

    async def Generate(self, request, context):
        yield pb.GenerateResponse(text="first")
        raise KeyError(SECRET)

    async def GetModelInfo(self, request, context):
        raise RuntimeError(SECRET)

    async def Complete(self, request, context):
        await abort_with(context, RequestError("INTERNAL", f"the executor failed the step: {SECRET}"))

    async def Tokenize(self, request, context):
        await abort_with(context, RequestError("RESOURCE_EXHAUSTED", "retry later"))


async def _serve_and_call(calls):
    server = grpc.aio.server()
    add_llmserve_servicer(Failing(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            results = []
            for call in calls:
                try:
                    await call(channel)
                    results.append((grpc.StatusCode.OK, ""))
                except grpc.aio.AioRpcError as e:
                    results.append((e.code(), e.details()))
            return results
    finally:
        await server.stop(None)


async def _stream(channel):
    return [m async for m in pb_grpc.LLMServeStub(channel).Generate(pb.GenerateRequest(text="x"))]


def test_unexpected_exceptions_and_internal_errors_leak_nothing(caplog):
    stub = pb_grpc.LLMServeStub
    calls = [
        _stream,
        lambda ch: stub(ch).GetModelInfo(pb.GetModelInfoRequest()),
        lambda ch: stub(ch).Complete(pb.GenerateRequest(text="x")),
        lambda ch: stub(ch).Tokenize(pb.TokenizeRequest(text="x")),
    ]
    with caplog.at_level(logging.INFO, logger="llmserve.api"):
        results = asyncio.run(_serve_and_call(calls))
    for code, details in results[:3]:
        assert code == grpc.StatusCode.INTERNAL
        assert details.startswith("internal error (error id ") and SECRET not in details
        error_id = details.removeprefix("internal error (error id ").removesuffix(")")
        assert any(error_id in r.getMessage() for r in caplog.records)  # the log says which
    assert results[3] == (grpc.StatusCode.RESOURCE_EXHAUSTED, "retry later")  # designed text stays
    assert SECRET in caplog.text and "Traceback" in caplog.text


@pytest.mark.parametrize("method,data", [
    ("Generate", b"\x0a\x02\xff\xfe"),
    ("Complete", b"\x22\x02\x08\xff"),
    ("Tokenize", b"\xff" * 16),
    ("GetServerStatus", b"\x0b"),
])
def test_malformed_bytes_are_invalid_argument(method, data):
    async def call(channel):
        make = channel.unary_stream if method == "Generate" else channel.unary_unary
        result = make(f"/llmserve.v1.LLMServe/{method}")(data)
        if method == "Generate":
            return [m async for m in result]
        return await result

    [(code, details)] = asyncio.run(_serve_and_call([call]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("the request is not a valid llmserve.v1.")
