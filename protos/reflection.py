"""Server reflection under both names clients ask for: grpc.reflection.v1alpha (what
grpcio-reflection serves) and grpc.reflection.v1 (what newer grpcurl, Postman and
grpc-java/grpc-go clients try first).

grpcio-reflection (1.84/1.85) only ships v1alpha. The v1 protocol is the same file with the
package renamed (same messages, same field numbers, so the same bytes on the wire), so the
one v1alpha servicer answers both: its handler is registered a second time under the v1
service name, and a v1 copy of the reflection file's descriptor is added to the pool so that
clients can also describe the v1 service itself."""

from __future__ import annotations

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2

V1ALPHA_SERVICE_NAME = reflection.SERVICE_NAME  # grpc.reflection.v1alpha.ServerReflection
V1_SERVICE_NAME = "grpc.reflection.v1.ServerReflection"
_V1_FILE = "grpc/reflection/v1/reflection.proto"


def _add_v1_descriptor(pool: descriptor_pool.DescriptorPool) -> None:
    """Adds grpc/reflection/v1/reflection.proto to `pool` (unless there already), made from
    the v1alpha file by renaming its package."""
    try:
        pool.FindFileByName(_V1_FILE)
        return
    except KeyError:
        pass
    file = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(file)
    file.name, file.package = _V1_FILE, "grpc.reflection.v1"
    file.ClearField("options")
    old, new = ".grpc.reflection.v1alpha.", ".grpc.reflection.v1."
    for message in file.message_type:
        for field in message.field:
            if field.type_name.startswith(old):
                field.type_name = new + field.type_name[len(old):]
    for service in file.service:
        for method in service.method:
            method.input_type = new + method.input_type[len(old):]
            method.output_type = new + method.output_type[len(old):]
    pool.Add(file)


def enable_reflection(service_names, server: grpc.aio.Server) -> None:
    """Serves reflection (v1alpha and v1) for `service_names` plus both reflection services,
    on a grpc.aio server, from the default descriptor pool."""
    pool = descriptor_pool.Default()
    _add_v1_descriptor(pool)
    names = (*service_names, V1ALPHA_SERVICE_NAME, V1_SERVICE_NAME)
    servicer = reflection.aio.ReflectionServicer(names, pool=pool)
    info = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString)
    for name in (V1ALPHA_SERVICE_NAME, V1_SERVICE_NAME):
        handlers = {"ServerReflectionInfo": info}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
        server.add_registered_method_handlers(name, handlers)
