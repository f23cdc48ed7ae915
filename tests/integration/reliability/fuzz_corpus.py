"""The hostile corpus of test_fuzz_doors.py (hostile/, README.md there): each entry as a case,
and its bytes as it goes on the wire (bodies written as the entry spells them; protobuf fields
encoded by hand, so values past a field's type and unknown field numbers can be sent)."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import json_format

from protos.llmserve.v1 import llmserve_pb2 as pb


HOSTILE = Path(__file__).parent / "hostile"
MIB = 1 << 20

# ---------------------------------------------------------------- the corpus


@dataclass
class HttpCase:
    id: str
    path: str
    expect: str  # "4xx" | "ok" | "either"
    method: str = "POST"
    json_text: str | None = None  # sent verbatim (UTF-8), @MODEL@ replaced
    raw: bytes | None = None
    big: tuple[str, dict] | None = None  # (template, spec): built when sent
    headers: dict = field(default_factory=dict)
    param: str | None = None
    param_optional: bool = False  # param may also be null (not JSON: no field was read)
    status: int | None = None
    completion_tokens: int | None = None
    check_model_id: bool = False

    @property
    def is_big(self) -> bool:
        return self.big is not None


def _literal_body(body: dict, value_text: str) -> str:
    """`body` as JSON text with "@V@" replaced by value_text verbatim, and @K@ (a key) by it."""
    text = json.dumps(body)
    return text.replace('"@V@"', value_text).replace("@K@", value_text.strip('"'))


def _load(name: str) -> dict:
    return json.loads((HOSTILE / name).read_text())


def http_cases() -> list[HttpCase]:
    cases: list[HttpCase] = []
    numbers = _load("http_numbers.json")
    for c in numbers["cases"]:
        for label, text in numbers["values"].items():
            cases.append(HttpCase(f"numbers:{c['field']}={label}", c["path"], c["expect"][label],
                                  json_text=_literal_body(c["body"], text), param=c["param"]))
    nans = _load("http_nan_inf.json")
    for c in nans["cases"]:
        for label, v in nans["values"].items():
            cases.append(HttpCase(f"nan_inf:{c['path']}:{c['field']}={label}", c["path"], c["expect"],
                                  json_text=_literal_body(c["body"], v["text"]), param=c["param"],
                                  param_optional=v["bare"]))
    for c in _load("http_types.json")["cases"]:
        for expect, values in (("4xx", c["wrong"]), ("either", c["coercible"])):
            for text in values:
                cases.append(HttpCase(f"types:{c['path']}:{c['field']}={text}", c["path"], expect,
                                      json_text=_literal_body(c["body"], text), param=c["param"]))
    for file in ("http_limits.json", "http_unimplemented.json", "http_routes.json",
                 "http_malformed.json", "http_big.json", "http_responses.json", "http_messages.json"):
        stem = file.removeprefix("http_").removesuffix(".json")
        for c in _load(file)["cases"]:
            case = HttpCase(f"{stem}:{c['name']}", c["path"], c["expect"], method=c.get("method", "POST"),
                            headers=c.get("headers", {}), param=c.get("param"),
                            param_optional=c.get("param_optional", False), status=c.get("status"),
                            completion_tokens=c.get("completion_tokens"),
                            check_model_id=c.get("check_model_id", False))
            if "body" in c:
                case.json_text = json.dumps(c["body"])
            elif "json" in c:
                case.json_text = c["json"]
            elif "hex" in c:
                case.raw = bytes.fromhex(c["hex"])
            elif "template" in c:
                case.big = (c["template"], c["big"])
            cases.append(case)
    assert len({c.id for c in cases}) == len(cases), "corpus ids must be unique"
    return cases


def _big_json(spec: dict) -> bytes:
    kind = spec["kind"]
    if kind == "nested_arrays":
        return b"[" * spec["depth"] + b"]" * spec["depth"]
    if kind == "nested_objects":
        return b'{"a":' * spec["depth"] + b"1" + b"}" * spec["depth"]
    if kind == "string":
        return b'"' + b"a" * spec["bytes"] + b'"'
    if kind == "escapes":
        return b'"' + b"\\u0061" * (spec["bytes"] // 6) + b'"'
    if kind == "spaces":
        return b" " * spec["bytes"]
    if kind == "ints":
        return b"[" + b",".join([spec["value"].encode()] * spec["count"]) + b"]"
    if kind == "strings":
        return b"[" + b",".join([b'"x"'] * spec["count"]) + b"]"
    if kind == "bias":
        return b"{" + b",".join(b'"%d":1' % i for i in range(spec["count"])) + b"}"
    if kind == "messages":
        return b"[" + b",".join([b'{"role":"user","content":"a"}'] * spec["count"]) + b"]"
    raise ValueError(kind)


def http_body(case: HttpCase, model: str) -> bytes | None:
    if case.json_text is not None:
        return case.json_text.replace("@MODEL@", model).encode("utf-8", "surrogatepass")
    if case.raw is not None:
        return case.raw
    if case.big is not None:
        template, spec = case.big
        return template.replace("@MODEL@", model).encode().replace(b"@BIG@", _big_json(spec))
    return None


@dataclass
class GrpcCase:
    id: str
    rpc: str
    expect: str
    message: dict | None = None
    append: list | None = None
    raw: bytes | None = None
    big: dict | None = None
    code: str | None = None

    @property
    def is_big(self) -> bool:
        return self.big is not None


REQUEST_TYPES = {"Generate": pb.GenerateRequest, "Complete": pb.GenerateRequest,
                 "Tokenize": pb.TokenizeRequest, "Detokenize": pb.DetokenizeRequest,
                 "GetModelInfo": pb.GetModelInfoRequest, "GetServerStatus": pb.GetServerStatusRequest}


def grpc_cases() -> list[GrpcCase]:
    cases = [GrpcCase(f"grpc:{c['rpc']}:{c['name']}", c["rpc"], c["expect"], c.get("message"),
                      c.get("append"), bytes.fromhex(c["hex"]) if "hex" in c else None, c.get("big"),
                      c.get("code")) for c in _load("grpc_corpus.json")["cases"]]
    assert len({c.id for c in cases}) == len(cases), "corpus ids must be unique"
    return cases


def _varint(v: int) -> bytes:
    v &= (1 << 64) - 1  # negatives as protobuf sends them (ten bytes)
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _tag(num: int, wire: int) -> bytes:
    return _varint(num << 3 | wire)


def _ld(num: int, data: bytes) -> bytes:
    return _tag(num, 2) + _varint(len(data)) + data


def encode_fields(fields: list) -> bytes:
    """[number, kind, value] fields as wire bytes (kinds: varint, fixed32, fixed64, bytes,
    hex (raw bytes, no tag), msg, packed, group)."""
    out = bytearray()
    for num, kind, value in fields:
        if kind == "varint":
            out += _tag(num, 0) + _varint(value)
        elif kind == "fixed64":
            out += _tag(num, 1) + struct.pack("<Q", value)
        elif kind == "fixed32":
            out += _tag(num, 5) + struct.pack("<I", value)
        elif kind == "bytes":
            out += _ld(num, value.encode())
        elif kind == "hex":
            out += bytes.fromhex(value)
        elif kind == "msg":
            out += _ld(num, encode_fields(value))
        elif kind == "packed":
            out += _ld(num, b"".join(_varint(v) for v in value))
        elif kind == "group":
            out += _tag(num, 3) + encode_fields(value) + _tag(num, 4)
        else:
            raise ValueError(kind)
    return bytes(out)


def _big_proto(spec: dict) -> bytes:
    kind, n = spec["kind"], spec.get("count", 0)
    if kind == "text":
        return _ld(1, b"a" * spec["bytes"])
    if kind == "token_ids":
        return _ld(2, _ld(1, b"\x05" * n))
    if kind == "detok_ids":
        return _ld(1, b"\x05" * n)
    if kind == "stop_token_ids":
        return _ld(4, _ld(7, b"\x05" * n))
    if kind == "stop_strings":
        return _ld(4, _ld(6, b"") * n)
    if kind == "logit_bias":
        return _ld(4, b"".join(_ld(18, _tag(1, 0) + _varint(i) + _tag(2, 5) + struct.pack("<f", 1.0))
                               for i in range(n)))
    if kind == "chat_messages":
        return _ld(3, _ld(1, b"") * n)
    if kind == "unknown_fields":
        return _tag(1000, 0) + b"\x01" + (_tag(1001, 0) + b"\x01") * (n - 1)
    raise ValueError(kind)


def grpc_bytes(case: GrpcCase) -> bytes:
    data = b""
    if case.message is not None:
        data += json_format.ParseDict(case.message, REQUEST_TYPES[case.rpc]()).SerializeToString()
    if case.raw is not None:
        data += case.raw
    if case.append:
        data += encode_fields(case.append)
    if case.big:
        data += _big_proto(case.big)
    return data


HTTP_CASES = http_cases()
GRPC_CASES = grpc_cases()


