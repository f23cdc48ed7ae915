"""LLMServe's methods on the public grpc.aio server, from the process's start, behind three
guards at the wire's edge.

The handler is registered before the server starts, when the executor is not known yet; until
`serve_with` installs the servicer, every LLMServe call is answered UNAVAILABLE ("the server is
starting"). One server and one socket serve the whole life of the process, so no client sees a
hand-over (a second server taking the port over cancelled the calls racing its stop).

1. Oversized requests: gRPC's own receive limit is fixed when the server is built, before the
   model's context length is known (`TRANSPORT_MAX_MODEL_LEN`); the deserializer refuses a
   request over the exact limit of the served model with RESOURCE_EXHAUSTED before parsing it.
2. Malformed bytes (invalid UTF-8 in a string field, truncated or garbage wire data): the
   generated `add_LLMServeServicer_to_server` parses with `FromString`, whose DecodeError grpc
   answers UNKNOWN/INTERNAL before any handler runs. Our deserializers return a `Refused`
   marker instead, which the guard answers with INVALID_ARGUMENT.
3. Unexpected exceptions: grpc would answer UNKNOWN with the exception's class and text. The
   guard logs the traceback under an error id and answers INTERNAL "internal error (error id
   ...)"; no internal text reaches a client.

Each guarded call has an access-log record (access_log.py) current while it runs; its line is
written when the call ends, with the status it ended with (an internal error's id and real
message, and the traceback of an unexpected exception, on that line at ERROR).
"""

from __future__ import annotations

import asyncio
import inspect
import traceback
import uuid
from collections.abc import Callable

import grpc
from google.protobuf.message import DecodeError

from protos.llmserve.v1 import llmserve_pb2 as pb
from scheduler_svc.api import access_log, memory
from scheduler_svc.api.grpc import codec
from scheduler_svc.messages import RequestError

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["LLMServe"].full_name


STARTING_MESSAGE = "the server is starting: the executor is not ready yet; retry shortly"


class Refused:
    """What a request's deserializer returns instead of a message it will not parse."""

    def __init__(self, code: grpc.StatusCode, message: str, num_bytes: int = 0):
        self.code = code
        self.message = message
        self.num_bytes = num_bytes  # of the refused request (memory.release_after)


class LLMServeHandlers(grpc.GenericRpcHandler):
    """LLMServe on a server: UNAVAILABLE for every method until `serve_with`, then the servicer's
    methods behind the guards (like the generated add_LLMServeServicer_to_server)."""

    def __init__(self):
        self._handlers: dict[str, grpc.RpcMethodHandler] | None = None

    def serve_with(self, servicer, max_request_bytes: int) -> None:
        handlers = {}
        for method in pb.DESCRIPTOR.services_by_name["LLMServe"].methods:
            request_cls = _message_class(method.input_type.name)
            response_cls = _message_class(method.output_type.name)
            behaviour = _guard(getattr(servicer, method.name), f"{SERVICE_NAME}/{method.name}")
            make = (grpc.unary_stream_rpc_method_handler if method.server_streaming
                    else grpc.unary_unary_rpc_method_handler)
            handlers[method.name] = make(
                behaviour, request_deserializer=_deserializer(request_cls, max_request_bytes),
                response_serializer=response_cls.SerializeToString)
        self._handlers = handlers  # one assignment: a call sees the old table or the new one

    def service(self, handler_call_details):
        service, _, name = handler_call_details.method.lstrip("/").partition("/")
        if service != SERVICE_NAME:
            return None  # UNIMPLEMENTED, as for any unknown service
        if self._handlers is None:
            return _STARTING
        return self._handlers.get(name)


async def _unavailable(request, context):
    await context.abort(grpc.StatusCode.UNAVAILABLE, STARTING_MESSAGE)


# Every LLMServe method takes one request message, so one unary handler answers each of them
# (it aborts before any response); the request is not parsed.
_STARTING = grpc.unary_unary_rpc_method_handler(_unavailable)


def add_llmserve_servicer(servicer, server: grpc.aio.Server, max_request_bytes: int = 1 << 62) -> None:
    """The servicer on a server that is not started yet, serving at once (tests)."""
    handlers = LLMServeHandlers()
    handlers.serve_with(servicer, max_request_bytes)
    server.add_generic_rpc_handlers((handlers,))


def _message_class(name: str) -> type:
    return getattr(pb, name)


def _deserializer(request_cls, max_bytes: int) -> Callable[[bytes], object]:
    def parse(data: bytes):
        if len(data) > max_bytes:
            return Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"the request is {len(data)} bytes; this server takes at most {max_bytes} "
                           "(from --max-prompt-bytes, --max-chat-messages, the stop limits and the "
                           "model's max_model_len)", len(data))
        try:
            request = request_cls.FromString(data)
        except DecodeError as e:
            reason = str(e).rpartition(": ")[2] or "wire format was corrupt"
            return Refused(grpc.StatusCode.INVALID_ARGUMENT,
                           f"the request is not a valid {request_cls.DESCRIPTOR.full_name}: {reason}",
                           len(data))
        where = codec.unknown_field(request)
        if where is not None:
            return Refused(grpc.StatusCode.INVALID_ARGUMENT,
                           f"{where}: field number {where.rpartition('#')[2]} is unknown to this "
                           f"server's {request_cls.DESCRIPTOR.full_name} (a newer client's field, or "
                           "one sent with the wrong wire type); remove it (unknown fields are refused, "
                           "not ignored, because they might change the output)", len(data))
        return request
    return parse


async def _internal_error(context, rpc: str) -> None:
    error_id = uuid.uuid4().hex[:12]
    access_log.internal_error(error_id, f"{rpc} raised", exc_info=True)  # with the traceback
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error (error id {error_id})")


async def abort_with(context, error: RequestError) -> None:
    """Ends the call with the error's status. An INTERNAL error's text is internal (e.g. the
    executor's exception): it goes to the log under an error id, the client gets the id."""
    if error.code == "INTERNAL":
        error_id = access_log.error_id_for(error.message)  # the core's own id, if it gave one
        access_log.internal_error(error_id, error.message)
        await context.abort(grpc.StatusCode.INTERNAL, f"internal error (error id {error_id})")
    access_log.current().param = getattr(error, "param", None)  # the field at fault, if known
    await context.abort(getattr(grpc.StatusCode, error.code), error.message)


def _ended(record: access_log.Record, context, error: BaseException | None, request) -> None:
    """The call's status on its record (an abort's code and details are on the context), then
    its access line."""
    if error is None:
        record.answered("OK", None)
    elif isinstance(error, grpc.aio.AbortError):
        code = context.code()
        record.answered(code.name if code is not None else "UNKNOWN", context.details() or None,
                        record.param)  # (abort_with's)
    # else cancelled (the client left, or its deadline passed): the status stays unset
    record.emit()
    memory.release_after(request.num_bytes if isinstance(request, Refused) else request.ByteSize())


def _guard(method, rpc: str):
    """The servicer method behind the refused-input check and the exception guard, with the
    call's access-log record (access_log.py) current while it runs."""
    name = rpc.rpartition("/")[2]
    if inspect.isasyncgenfunction(method):
        async def stream(request, context):
            record, error = access_log.begin("grpc", name), None
            try:
                if isinstance(request, Refused):
                    await context.abort(request.code, request.message)
                try:
                    async for response in method(request, context):
                        yield response
                except (grpc.aio.AbortError, asyncio.CancelledError, GeneratorExit):
                    raise
                except Exception:
                    await _internal_error(context, rpc)
            except BaseException as e:
                error = e
                raise
            finally:
                _ended(record, context, error, request)
                _let_go(error)
                error = request = None
        return stream

    async def unary(request, context):
        record, error = access_log.begin("grpc", name), None
        try:
            if isinstance(request, Refused):
                await context.abort(request.code, request.message)
            try:
                return await method(request, context)
            except (grpc.aio.AbortError, asyncio.CancelledError):
                raise
            except Exception:
                await _internal_error(context, rpc)
        except BaseException as e:
            error = e
            raise
        finally:
            _ended(record, context, error, request)
            _let_go(error)
            error = request = None
    return unary


def _let_go(error: BaseException | None) -> None:
    """Clears the locals of the frames an ending call's error holds. grpc keeps an abort's
    AbortError on the call's RPCState, which its context (a local of those frames) holds back:
    a cycle the collector does not break, that kept every refused request alive (a 4 MiB
    prompt: ~18 MB of proto and text each, measured, until an unrelated collection)."""
    while error is not None:
        traceback.clear_frames(error.__traceback__)  # (the executing frame is skipped)
        error = error.__cause__ or error.__context__
