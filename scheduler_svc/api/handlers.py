"""Registers the public servicer on a grpc.aio server behind two guards at the wire's edge.

1. Malformed bytes (invalid UTF-8 in a string field, truncated or garbage wire data): the
   generated `add_LLMServeServicer_to_server` parses with `FromString`, whose DecodeError grpc
   answers UNKNOWN/INTERNAL before any handler runs. Our deserializers return a `Malformed`
   marker instead, which the guard answers with INVALID_ARGUMENT.
2. Unexpected exceptions: grpc would answer UNKNOWN with the exception's class and text. The
   guard logs the traceback under an error id and answers INTERNAL "internal error (error id
   ...)"; no internal text reaches a client.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import uuid
from collections.abc import Callable

import grpc
from google.protobuf.message import DecodeError

from protos.llmserve.v1 import llmserve_pb2 as pb
from scheduler_svc.messages import RequestError

log = logging.getLogger("llmserve.api")
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["LLMServe"].full_name


class Malformed:
    """What a request's deserializer returns for bytes that are not a valid message."""

    def __init__(self, message_type: str, reason: str):
        self.message = f"the request is not a valid {message_type}: {reason}"


def add_llmserve_servicer(servicer, server: grpc.aio.Server) -> None:
    """Like the generated add_LLMServeServicer_to_server, with guarded handlers."""
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name["LLMServe"].methods:
        request_cls = _message_class(method.input_type.name)
        response_cls = _message_class(method.output_type.name)
        behaviour = _guard(getattr(servicer, method.name), f"{SERVICE_NAME}/{method.name}")
        make = (grpc.unary_stream_rpc_method_handler if method.server_streaming
                else grpc.unary_unary_rpc_method_handler)
        handlers[method.name] = make(behaviour, request_deserializer=_deserializer(request_cls),
                                     response_serializer=response_cls.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


def _message_class(name: str) -> type:
    return getattr(pb, name)


def _deserializer(request_cls) -> Callable[[bytes], object]:
    def parse(data: bytes):
        try:
            return request_cls.FromString(data)
        except DecodeError as e:
            reason = str(e).rpartition(": ")[2] or "wire format was corrupt"
            return Malformed(request_cls.DESCRIPTOR.full_name, reason)
    return parse


async def _internal_error(context, rpc: str) -> None:
    error_id = uuid.uuid4().hex[:12]
    log.exception("%s failed (error id %s)", rpc, error_id)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error (error id {error_id})")


async def abort_with(context, error: RequestError) -> None:
    """Ends the call with the error's status. An INTERNAL error's text is internal (e.g. the
    executor's exception): it goes to the log under an error id, the client gets the id."""
    if error.code == "INTERNAL":
        error_id = uuid.uuid4().hex[:12]
        log.error("request failed (error id %s): %s", error_id, error.message)
        await context.abort(grpc.StatusCode.INTERNAL, f"internal error (error id {error_id})")
    await context.abort(getattr(grpc.StatusCode, error.code), error.message)


def _guard(method, rpc: str):
    """The servicer method behind the malformed-input check and the exception guard."""
    if inspect.isasyncgenfunction(method):
        async def stream(request, context):
            if isinstance(request, Malformed):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
            try:
                async for response in method(request, context):
                    yield response
            except (grpc.aio.AbortError, asyncio.CancelledError):
                raise
            except Exception:
                await _internal_error(context, rpc)
        return stream

    async def unary(request, context):
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        try:
            return await method(request, context)
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception:
            await _internal_error(context, rpc)
    return unary
