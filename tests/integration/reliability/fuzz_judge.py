"""Sending one case of the hostile corpus (fuzz_corpus.py) and judging its answer against
what the entry expects (test_fuzz_doors.py says what each expectation means)."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass

import grpc

from protos.llmserve.v1 import llmserve_pb2 as pb
from tests.integration.reliability.fuzz_corpus import GrpcCase, HttpCase, grpc_bytes, http_body

try:
    import httpx
except ImportError:  # the fork the openai package ships with here
    import httpx2 as httpx


BAD_GRPC = {grpc.StatusCode.OK, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
            grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
ERROR_KEYS = {"message", "type", "param", "code"}
# A list or map field's error may name a path under it, as the client sent it (messages.0.content,
# stop_token_ids.3, logit_bias.5), never a name of the server's schema (prompt.str, stop.list[str]).
PATH_FIELDS = {"prompt", "stop", "stop_token_ids", "tokens", "messages", "logit_bias", "stream_options"}
PATH_KEYS = {"role", "content", "text", "type", "image_url", "input_audio", "include_usage"}


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
    elif case.path == "/v1/responses":
        problems += _judge_response(o.body)
    elif case.path.startswith("/v1/messages"):
        problems += _judge_message(o.body, case.path)
    elif case.check_model_id:
        answer = _json(o.body)
        if not isinstance(answer, dict) or answer.get("id") != model:
            problems.append(f"want the model {model!r}, got {o.show()}")
    return problems


def _judge_response(body: bytes) -> list[str]:
    """A Responses API answer: a response object, or a stream of events ending completed or
    incomplete (no failure, no error event)."""
    text = body.decode("utf-8", "replace")
    if text.startswith("event: "):
        types = [line.removeprefix("event: ") for line in text.splitlines() if line.startswith("event: ")]
        if types[-1:] not in (["response.completed"], ["response.incomplete"]) or "error" in types:
            return [f"the stream does not end completed or incomplete: {text[-300:]!r}"]
        return []
    answer = _json(body)
    if not isinstance(answer, dict) or answer.get("object") != "response" or not answer.get("output") \
            or answer.get("status") not in ("completed", "incomplete"):
        return [f"not a finished response: {text[:600]!r}"]
    return []


MESSAGE_STOPS = {"end_turn", "max_tokens", "stop_sequence", "tool_use"}


def _judge_message(body: bytes, path: str) -> list[str]:
    """An Anthropic Messages answer: {"input_tokens"} from count_tokens, a message with a stop
    reason, or a stream of events ending message_stop (no error event)."""
    text = body.decode("utf-8", "replace")
    answer = _json(body)
    if path.endswith("/count_tokens"):
        ok = isinstance(answer, dict) and isinstance(answer.get("input_tokens"), int) and answer["input_tokens"] > 0
        return [] if ok else [f"not a token count: {text[:600]!r}"]
    if text.startswith("event: "):
        types = [line.removeprefix("event: ") for line in text.splitlines() if line.startswith("event: ")]
        if types[:1] != ["message_start"] or types[-1:] != ["message_stop"] or "error" in types:
            return [f"the stream does not run message_start .. message_stop: {text[-300:]!r}"]
        return []
    if not isinstance(answer, dict) or answer.get("type") != "message" or not isinstance(answer.get("content"), list) \
            or answer.get("stop_reason") not in MESSAGE_STOPS:
        return [f"not a finished message: {text[:600]!r}"]
    return []


def _judge_anthropic_4xx(case: HttpCase, o: Outcome) -> list[str]:
    """/v1/messages answers errors in Anthropic's shape {"type": "error", "error": {"type",
    "message"}}: no param, the message starts with the field it names."""
    body = _json(o.body)
    err = body.get("error") if isinstance(body, dict) else None
    if body is None or body.get("type") != "error" or not isinstance(err, dict) or \
            not isinstance(err.get("type"), str) or not isinstance(err.get("message"), str) or not err["message"]:
        return [f"not Anthropic's error shape: {o.show()}"]
    if "Traceback" in err["message"]:
        return [f"a traceback in the message: {o.show()}"]
    if case.param is not None:
        named = re.match(r"[\w.\[\]]+", err["message"])
        named = named.group() if named else None
        if not (named == case.param or _names_a_path_under(named, case.param) or case.param_optional):
            return [f"want the message to start with {case.param!r}: {o.show()}"]
    return []


def judge_http_4xx(case: HttpCase, o: Outcome) -> list[str]:
    if not (isinstance(o.status, int) and 400 <= o.status < 500):
        return [f"want 4xx, got {o.show()}"]
    problems = []
    if case.status is not None and o.status != case.status:
        problems.append(f"want HTTP {case.status}, got {o.status}")
    if case.path.startswith("/v1/messages"):
        return problems + _judge_anthropic_4xx(case, o)
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


