"""Server reflection answers under grpc.reflection.v1 as well as v1alpha (protos/reflection.py),
through a real channel to a grpc.aio server set up the way the public server does it."""

from __future__ import annotations

import asyncio

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_health.v1 import health, health_pb2_grpc

from protos.llmserve.v1 import llmserve_pb2 as pb
from protos.reflection import V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME, enable_reflection

LLMSERVE = pb.DESCRIPTOR.services_by_name["LLMServe"].full_name


def _v1_class(name: str):
    return message_factory.GetMessageClass(
        descriptor_pool.Default().FindMessageTypeByName(f"grpc.reflection.v1.{name}"))


async def _ask(service: str, requests: list) -> list:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    enable_reflection((LLMSERVE, health.SERVICE_NAME), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        request_cls, response_cls = _v1_class("ServerReflectionRequest"), _v1_class("ServerReflectionResponse")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.stream_stream(f"/{service}/ServerReflectionInfo",
                                         request_serializer=lambda m: m.SerializeToString(),
                                         response_deserializer=response_cls.FromString)
            wire = [request_cls(**r) for r in requests]
            return [reply async for reply in call(iter(wire), timeout=10)]
    finally:
        await server.stop(None)


def test_v1_lists_services_and_serves_descriptors():
    replies = asyncio.run(_ask(V1_SERVICE_NAME, [
        dict(list_services=""),
        dict(file_containing_symbol=LLMSERVE),
        dict(file_containing_symbol=V1_SERVICE_NAME),
    ]))
    assert len(replies) == 3 and not any(r.HasField("error_response") for r in replies)
    names = {s.name for s in replies[0].list_services_response.service}
    assert {LLMSERVE, "grpc.health.v1.Health", V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME} <= names

    files = {}
    for reply in replies[1:]:
        for raw in reply.file_descriptor_response.file_descriptor_proto:
            file = descriptor_pb2.FileDescriptorProto.FromString(raw)
            files[file.name] = file
    public = files["protos/llmserve/v1/llmserve.proto"]
    assert public.package == "llmserve.v1"
    assert public.options.go_package.endswith(";llmservev1")
    assert public.options.java_package == "com.llmserve.v1"
    reflection_v1 = files["grpc/reflection/v1/reflection.proto"]
    (method,) = reflection_v1.service[0].method
    assert method.input_type == ".grpc.reflection.v1.ServerReflectionRequest"


def test_v1alpha_still_answers():
    replies = asyncio.run(_ask(V1ALPHA_SERVICE_NAME, [dict(list_services="")]))
    names = {s.name for s in replies[0].list_services_response.service}
    assert {LLMSERVE, V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME} <= names
