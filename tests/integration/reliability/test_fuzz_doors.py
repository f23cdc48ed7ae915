"""Fuzzing both doors of one real cluster (gRPC and the OpenAI-compatible HTTP API) with the
hostile corpus in hostile/ (README.md there says what each file holds), while normal clients
stream beside it.

One module fixture runs everything once: the normal streams alone (their references), then the
corpus batch by batch (a file, or a part of one, per batch; the requests of a batch at once on
threads) while the normal streams (gRPC greedy and seeded, HTTP streaming completion greedy,
HTTP streaming chat seeded) run over and over, and the health of both doors after every batch;
then the API process's memory after a gc period. The tests below judge what it recorded:

- every corpus entry (one test each): `expect` "4xx" is an HTTP status in 400-499 with a body
  in OpenAI's error shape {"error": {"message", "type", "param", "code"}} (`param` equal to the
  field as the client sent it, where the entry names one; `status` exact where given), or a
  non-OK gRPC status that is not INTERNAL/UNKNOWN (nor UNAVAILABLE/DEADLINE_EXCEEDED/CANCELLED:
  the server failed or hung); "ok" is a 200 with a real answer (OK and a finished stream on
  gRPC); "either" is one of the two;
- every normal stream during the fuzzing equals its reference, token for token;
- both doors answer health (SERVING, 200) after every batch;
- the API process's VmRSS is back within RSS_BOUND_MIB of its baseline after a gc period.
"""

from __future__ import annotations

import json
import re
import struct
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks.cluster import Cluster, free_port, generate
from protos.llmserve.v1 import llmserve_pb2 as pb

try:
    import httpx
except ImportError:  # the fork the openai package ships with here
    import httpx2 as httpx

HOSTILE = Path(__file__).parent / "hostile"
MIB = 1 << 20
# VmRSS of the API process after the fuzzing and a gc period, over its baseline. Measured on the
# demo model: the small batches (~900 requests) add ~2 MiB; the big bodies (http_big.json, the
# gRPC `big` entries) add 150-190 MiB that the process keeps (a second pass adds ~20 more: held
# by the allocator rather than leaked per request). 64 MiB leaves room for caches and arenas of
# normal traffic, not for keeping what one hostile body cost.
RSS_BOUND_MIB = 64
GC_PERIOD_S = 15.0
HTTP_WORKERS, GRPC_WORKERS, BIG_WORKERS = 8, 8, 2
BATCH_SIZE = 48
BAD_GRPC = {grpc.StatusCode.OK, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
            grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
ERROR_KEYS = {"message", "type", "param", "code"}
# A list or map field's error may name a path under it, as the client sent it (messages.0.content,
# stop_token_ids.3, logit_bias.5), never a name of the server's schema (prompt.str, stop.list[str]).
PATH_FIELDS = {"prompt", "stop", "stop_token_ids", "tokens", "messages", "logit_bias", "stream_options"}
PATH_KEYS = {"role", "content", "text", "type", "image_url", "input_audio", "include_usage"}


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
                 "http_malformed.json", "http_big.json"):
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
        return template.encode().replace(b"@BIG@", _big_json(spec))
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


# ---------------------------------------------------------------- the cluster


@pytest.fixture(scope="module")
def cluster(model_dirs, tmp_path_factory):
    http_port = free_port()
    c = Cluster(model_dirs["llama"], tmp_path_factory.mktemp("logs-fuzz-doors"), ["--device", "cpu"],
                ["--http-port", str(http_port)])
    c.http_url = f"http://127.0.0.1:{http_port}"
    deadline = time.monotonic() + 30
    while True:  # the HTTP server starts just after the gRPC one
        try:
            urllib.request.urlopen(c.http_url + "/health", timeout=2)
            break
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                c.stop()
                raise
            time.sleep(0.1)
    yield c
    c.stop()


def _rss_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


# ---------------------------------------------------------------- normal clients


def _grpc_stream(cluster, **params) -> list[int]:
    return generate(cluster.stub, prompt_ids=[5, 9, 11, 13], timeout=60, **params)[0]


def _sse(client: httpx.Client, path: str, body: dict) -> tuple[list[int], str]:
    """An HTTP streaming request's token ids and text; raises on anything but a clean stream."""
    ids, text, done = [], [], False
    with client.stream("POST", path, json=body, timeout=60) as r:
        if r.status_code != 200:
            raise AssertionError(f"{path}: HTTP {r.status_code}: {r.read()[:500]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                done = True
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                raise AssertionError(f"{path}: error event {chunk}")
            for choice in chunk["choices"]:
                ids += choice.get("token_ids") or []
                text.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
    assert done, f"{path}: the stream ended without [DONE]"
    return ids, "".join(text)


NORMAL_STREAMS = {
    "grpc greedy": lambda cl, http: _grpc_stream(cl, max_tokens=24, temperature=0.0, ignore_eos=True),
    "grpc seeded": lambda cl, http: _grpc_stream(cl, max_tokens=24, temperature=1.0, seed=1234,
                                                 top_k=50, ignore_eos=True),
    "http completion greedy": lambda cl, http: _sse(http, "/v1/completions", {
        "prompt": "the quick brown fox", "max_tokens": 24, "temperature": 0, "stream": True,
        "ignore_eos": True, "return_token_ids": True}),
    "http chat seeded": lambda cl, http: _sse(http, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "tell me a story"}], "max_tokens": 24,
        "temperature": 0.8, "seed": 7, "stream": True, "ignore_eos": True, "return_token_ids": True}),
}


# ---------------------------------------------------------------- sending one case


@dataclass
class Outcome:
    status: object  # HTTP status (int) or grpc.StatusCode
    body: bytes = b""
    details: str = ""
    content_type: str = ""
    error: str = ""  # the client's exception, when there was no answer
    seconds: float = 0.0

    def show(self) -> str:
        if self.error:
            return f"no answer: {self.error}"
        if isinstance(self.status, int):
            return f"HTTP {self.status} {self.content_type}: {self.body[:600].decode('utf-8', 'replace')}"
        return f"gRPC {self.status.name}: {self.details[:600]}"


def send_http(client: httpx.Client, case: HttpCase, model: str) -> Outcome:
    headers = {"content-type": "application/json"}
    for k, v in case.headers.items():
        if v is None:
            headers.pop(k, None)
        else:
            headers[k] = v
    body = http_body(case, model)
    start = time.monotonic()
    try:
        r = client.request(case.method, case.path.replace("@MODEL@", model), content=body,
                           headers=headers, timeout=60)
        return Outcome(r.status_code, r.content, content_type=r.headers.get("content-type", ""),
                       seconds=time.monotonic() - start)
    except Exception as e:  # noqa: BLE001  (a reset connection is a finding, not a crash)
        return Outcome(None, error=f"{type(e).__name__}: {e}", seconds=time.monotonic() - start)


def send_grpc(channel: grpc.Channel, case: GrpcCase) -> Outcome:
    method = f"/llmserve.v1.LLMServe/{case.rpc}"
    data = grpc_bytes(case)
    start = time.monotonic()
    try:
        if case.rpc == "Generate":
            call = channel.unary_stream(method, request_serializer=None, response_deserializer=None)
            messages = [pb.GenerateResponse.FromString(m) for m in call(data, timeout=60)]
            finished = sum(1 for m in messages if m.finish_reason != pb.FINISH_REASON_UNSPECIFIED)
            details = f"{len(messages)} messages, {finished} finished, " \
                      f"{sum(len(m.token_ids) for m in messages)} tokens"
            if not finished:
                return Outcome(grpc.StatusCode.OK, details="OK but no message finished: " + details,
                               error="unfinished stream", seconds=time.monotonic() - start)
        else:
            call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
            details = f"{len(call(data, timeout=60))} response bytes"
        return Outcome(grpc.StatusCode.OK, details=details, seconds=time.monotonic() - start)
    except grpc.RpcError as e:
        return Outcome(e.code(), details=e.details() or "", seconds=time.monotonic() - start)


# ---------------------------------------------------------------- judging one outcome


def _json(body: bytes):
    try:
        return json.loads(body)
    except ValueError:
        return None


def judge_http_ok(case: HttpCase, o: Outcome, model: str) -> list[str]:
    problems = []
    if o.status != 200:
        return [f"want 200, got {o.show()}"]
    if case.path in ("/v1/completions", "/v1/chat/completions"):
        text = o.body.decode("utf-8", "replace")
        if text.startswith("data: "):  # a stream: chunks, no error event, [DONE]
            events = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]
            if events[-1:] != ["[DONE]"]:
                problems.append(f"the stream does not end with [DONE]: {text[-300:]!r}")
            if any('"error"' in e for e in events):
                problems.append(f"an error event in a 200 stream: {text[:600]!r}")
        else:
            answer = _json(o.body)
            if not isinstance(answer, dict) or not answer.get("choices"):
                problems.append(f"no choices in {o.show()}")
            elif case.completion_tokens is not None and \
                    answer["usage"]["completion_tokens"] != case.completion_tokens:
                problems.append(f"want {case.completion_tokens} completion tokens, got "
                                f"{answer['usage']['completion_tokens']}")
    elif case.check_model_id:
        answer = _json(o.body)
        if not isinstance(answer, dict) or answer.get("id") != model:
            problems.append(f"want the model {model!r}, got {o.show()}")
    return problems


def judge_http_4xx(case: HttpCase, o: Outcome) -> list[str]:
    if not (isinstance(o.status, int) and 400 <= o.status < 500):
        return [f"want 4xx, got {o.show()}"]
    problems = []
    if case.status is not None and o.status != case.status:
        problems.append(f"want HTTP {case.status}, got {o.status}")
    body = _json(o.body)
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict) or not ERROR_KEYS <= set(err):
        return problems + [f"not OpenAI's error shape: {o.show()}"]
    if not isinstance(err["message"], str) or not err["message"] or not isinstance(err["type"], str):
        problems.append(f"error message/type missing: {o.show()}")
    if not isinstance(err["code"], (str, type(None))) or not isinstance(err["param"], (str, type(None))):
        problems.append(f"error code/param not a string or null: {o.show()}")
    if "Traceback" in str(err["message"]):
        problems.append(f"a traceback in the message: {o.show()}")
    if case.param is not None:
        param = err["param"]
        good = param == case.param or (case.param_optional and param is None) or _names_a_path_under(
            param, case.param)
        if not good:
            problems.append(f"want param {case.param!r}, got {param!r}: {o.show()}")
    return problems


def _names_a_path_under(param, name: str) -> bool:
    if name not in PATH_FIELDS or not isinstance(param, str) or not param.startswith(name):
        return False
    rest = re.sub(r"\[(\d+)\]", r".\1", param[len(name):])
    return rest.startswith(".") and all(s.isdigit() or s in PATH_KEYS for s in rest[1:].split("."))


def judge_http(case: HttpCase, o: Outcome, model: str) -> list[str]:
    if case.expect == "ok":
        return judge_http_ok(case, o, model)
    if case.expect == "4xx":
        return judge_http_4xx(case, o)
    if o.status == 200:
        return judge_http_ok(case, o, model)
    return judge_http_4xx(case, o)


def judge_grpc(case: GrpcCase, o: Outcome) -> list[str]:
    if o.error:
        return [o.show()]
    if case.expect == "ok" or (case.expect == "either" and o.status == grpc.StatusCode.OK):
        return [] if o.status == grpc.StatusCode.OK else [f"want OK, got {o.show()}"]
    if o.status in BAD_GRPC:
        return [f"want a refusal (not {', '.join(sorted(c.name for c in BAD_GRPC))}), got {o.show()}"]
    problems = []
    if case.code and o.status.name != case.code:
        problems.append(f"want {case.code}, got {o.show()}")
    if "Traceback" in o.details:
        problems.append(f"a traceback in the details: {o.show()}")
    return problems


# ---------------------------------------------------------------- the run


@dataclass
class Run:
    model: str
    references: dict
    outcomes: dict = field(default_factory=dict)  # case id -> Outcome
    # normal stream name -> [(batches running at its start and end, result or exception text)]
    streams: dict = field(default_factory=dict)
    current_batch: str = "before the batches"
    health: list = field(default_factory=list)  # (batch, grpc status, http status)
    batches: list = field(default_factory=list)  # (batch, seconds, VmRSS MiB after it)
    rss_baseline_kib: int = 0
    rss_peak_kib: int = 0
    rss_after_kib: int = 0
    seconds: float = 0.0


def _health(cluster, http: httpx.Client) -> tuple[str, object]:
    try:
        g = health_pb2_grpc.HealthStub(cluster.channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        grpc_status = health_pb2.HealthCheckResponse.ServingStatus.Name(g.status)
    except grpc.RpcError as e:
        grpc_status = f"error {e.code().name}"
    try:
        http_status = http.get("/health", timeout=10).status_code
    except httpx.HTTPError as e:
        http_status = f"error {e!r}"
    return grpc_status, http_status


def _batches(http: list[HttpCase], grpcs: list[GrpcCase]):
    """(name, workers, [(kind, case)]): each file's small cases in batches, big ones apart."""
    by_group: dict[str, list] = {}
    for kind, cases in (("http", http), ("grpc", grpcs)):
        for case in cases:
            group = case.id.split(":")[0] + (":big" if case.is_big else "")
            by_group.setdefault(group, []).append((kind, case))
    for group, items in by_group.items():
        size = len(items) if group.endswith(":big") else BATCH_SIZE
        for i in range(0, len(items), size):
            workers = BIG_WORKERS if group.endswith(":big") else \
                (HTTP_WORKERS if items[0][0] == "http" else GRPC_WORKERS)
            yield f"{group}[{i}:{i + size}]", workers, items[i:i + size]


@pytest.fixture(scope="module")
def run(cluster) -> Run:
    start = time.monotonic()
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    with httpx.Client(base_url=cluster.http_url, limits=limits) as http:
        model = http.get("/v1/models", timeout=10).json()["data"][0]["id"]
        # alone first: the references (twice: warm-up, and each is stable on its own)
        references = {}
        for name, fn in NORMAL_STREAMS.items():
            first, second = fn(cluster, http), fn(cluster, http)
            assert first == second, f"{name} differs between two runs alone: {first} != {second}"
            references[name] = first
        for case in HTTP_CASES[:3] + [c for c in HTTP_CASES if c.id.startswith("limits:")][:3]:
            send_http(http, case, model)  # warm-up of the error paths
        r = Run(model, references)
        api_pid = cluster.procs[1].pid
        r.rss_baseline_kib = r.rss_peak_kib = _rss_kib(api_pid)

        done = threading.Event()

        def stream_until_done(name, fn):
            results = r.streams.setdefault(name, [])
            while not done.is_set():
                began = r.current_batch
                try:
                    got = fn(cluster, http)
                except Exception as e:  # noqa: BLE001  (recorded, judged by the test)
                    got = f"{type(e).__name__}: {e}"
                results.append((f"{began} .. {r.current_batch}", got))

        threads = [threading.Thread(target=stream_until_done, args=item, daemon=True)
                   for item in NORMAL_STREAMS.items()]
        for t in threads:
            t.start()
        try:
            for name, workers, items in _batches(HTTP_CASES, GRPC_CASES):
                batch_start = time.monotonic()
                r.current_batch = name
                def one(item):
                    kind, case = item
                    if kind == "http":
                        return send_http(http, case, model)
                    return send_grpc(cluster.channel, case)

                with ThreadPoolExecutor(workers) as pool:
                    for (_, case), outcome in zip(items, pool.map(one, items)):
                        r.outcomes[case.id] = outcome
                rss = _rss_kib(api_pid)
                r.rss_peak_kib = max(r.rss_peak_kib, rss)
                r.batches.append((name, round(time.monotonic() - batch_start, 2), round(rss / 1024, 1)))
                r.health.append((name, *_health(cluster, http)))
        finally:
            done.set()
            for t in threads:
                t.join(timeout=120)
        r.health.append(("after the streams", *_health(cluster, http)))
        deadline = time.monotonic() + GC_PERIOD_S
        while True:  # the gc period: memory may take a moment to go back
            r.rss_after_kib = _rss_kib(api_pid)
            if r.rss_after_kib - r.rss_baseline_kib <= RSS_BOUND_MIB * 1024 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    r.seconds = time.monotonic() - start
    print(f"\nfuzz run: {len(r.outcomes)} requests in {r.seconds:.1f}s; normal streams "
          f"{ {k: len(v) for k, v in r.streams.items()} }; API VmRSS baseline "
          f"{r.rss_baseline_kib / 1024:.1f} MiB, peak {r.rss_peak_kib / 1024:.1f} MiB, after "
          f"{r.rss_after_kib / 1024:.1f} MiB (+{(r.rss_after_kib - r.rss_baseline_kib) / 1024:.1f} MiB)")
    print("batches (name, seconds, VmRSS MiB after):", *r.batches, sep="\n  ")
    return r


# ---------------------------------------------------------------- the tests


@pytest.mark.parametrize("case", HTTP_CASES, ids=[c.id for c in HTTP_CASES])
def test_http_entry(run, case):
    outcome = run.outcomes[case.id]
    problems = judge_http(case, outcome, run.model)
    assert not problems, f"[expect {case.expect}] " + "; ".join(problems)


@pytest.mark.parametrize("case", GRPC_CASES, ids=[c.id for c in GRPC_CASES])
def test_grpc_entry(run, case):
    outcome = run.outcomes[case.id]
    problems = judge_grpc(case, outcome)
    assert not problems, f"[expect {case.expect}] " + "; ".join(problems)


def test_normal_streams_stay_token_exact_during_the_fuzzing(run):
    for name, reference in run.references.items():
        results = run.streams.get(name, [])
        assert len(results) >= 2, f"{name} ran only {len(results)} times during the fuzzing"
        bad = [(i, during, got) for i, (during, got) in enumerate(results) if got != reference]
        assert not bad, f"{name}: {len(bad)} of {len(results)} runs differ from the reference " \
                        f"{reference}: (run, batches during it, got): {bad[:3]}"


def test_both_doors_stay_up_after_every_batch(run):
    bad = [h for h in run.health if h[1:] != ("SERVING", 200)]
    assert not bad, f"health not (SERVING, 200) after: {bad}"


def test_api_process_memory_returns_to_its_baseline(run):
    growth_mib = (run.rss_after_kib - run.rss_baseline_kib) / 1024
    assert growth_mib <= RSS_BOUND_MIB, (
        f"the API process kept {growth_mib:.1f} MiB over its baseline of "
        f"{run.rss_baseline_kib / 1024:.1f} MiB after a {GC_PERIOD_S:.0f}s gc period "
        f"(peak {run.rss_peak_kib / 1024:.1f} MiB; after each batch: {run.batches})")


def test_the_corpus_covers_what_it_must():
    """The corpus itself: each kind of hostile input is there (a guard against trimming it)."""
    ids = " ".join(c.id for c in HTTP_CASES + GRPC_CASES)
    for needle in ("truncated", "trailing garbage", "duplicate keys", "BOM", "=2**64", "=1e39",
                   "=-0.0", "=1e308", "=1e-50", "bare NaN", "string -Infinity", "10k nested arrays",
                   "10k nested objects", "10 MB prompt", "bad UTF-8", "lone high surrogate",
                   "response_format", "tools", "tool_choice", "functions", "guided_json",
                   "structured_outputs", "prompt_logprobs", "GET /v1/nope", "garbage bytes",
                   "unknown varint field", "uint32 max", "int32 min", "6 MB message", "50 MB message",
                   "1M token ids"):
        assert needle in ids, needle
    fields = {c.id.split(":")[-1].split("=")[0] for c in HTTP_CASES if c.id.startswith("types:")}
    for f in ("n", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids",
              "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty", "repetition_penalty",
              "min_p", "logit_bias", "min_tokens", "messages", "prompt", "max_completion_tokens"):
        assert f in fields, f
