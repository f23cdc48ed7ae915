"""Hostile requests against one real cluster: each gets its exact status code (and a message a
user can act on), and after each the server is healthy, serves a normal request token-exact
and holds nothing. Then: a large prompt is refused without stalling another client's stream,
and the API process gives the memory back."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks.cluster import generate
from protos.llmserve.v1 import llmserve_pb2 as pb
from tests.integration.conftest import start_cluster

OK = grpc.StatusCode.OK
INVALID = grpc.StatusCode.INVALID_ARGUMENT
MIB = 1 << 20
NORMAL = dict(prompt_ids=[5, 9, 11, 13], max_tokens=6, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def cluster(model_dirs, tmp_path_factory):
    c = start_cluster(tmp_path_factory, model_dirs["llama"], "hostile")
    yield c
    c.stop()


@pytest.fixture(scope="module")
def reference(cluster):
    """The normal request's tokens before any hostile request."""
    return generate(cluster.stub, **NORMAL)[0]


@dataclass
class Hostile:
    """One request: a message (or raw bytes) for an RPC, and the status it must get."""

    name: str
    request: object  # a pb message, or bytes sent unserialized
    code: grpc.StatusCode
    needle: str = ""
    rpc: str = "Generate"


def _gen(name, code, needle="", ids=(5, 6), text=None, chat=None, rid="", **params) -> Hostile:
    params.setdefault("max_tokens", 4)
    req = pb.GenerateRequest(params=pb.SamplingParams(**params), request_id=rid)
    if chat is not None:
        req.chat.CopyFrom(pb.ChatMessages(messages=[pb.ChatMessage(role=r, content=c) for r, c in chat]))
    elif text is not None:
        req.text = text
    elif ids is not None:
        req.token_ids.CopyFrom(pb.TokenIds(ids=list(ids)))
    return Hostile(name, req, code, needle)


def _corrupt(message, marker: bytes, bad: bytes) -> bytes:
    """The message's bytes with `marker` replaced by the same number of other bytes."""
    data = message.SerializeToString()
    assert data.count(marker) == 1 and len(bad) == len(marker)
    return data.replace(marker, bad)


def _chat_of(num_messages: int) -> pb.GenerateRequest:
    req = pb.GenerateRequest(params=pb.SamplingParams(max_tokens=4))
    req.chat.messages.extend([pb.ChatMessage()] * num_messages)
    return req


BAD_UTF8 = b"\xff\xfe"
NAN, INF = float("nan"), float("inf")
HOSTILE = [
    # empty prompts
    _gen("empty text", INVALID, "empty", text=""),
    _gen("empty token ids", INVALID, "empty", ids=()),
    _gen("chat with no messages", INVALID, "no messages", chat=[]),
    _gen("no input", INVALID, "no input", ids=None),
    Hostile("tokenize empty text", pb.TokenizeRequest(text=""), INVALID, "empty", "Tokenize"),
    # sizes
    _gen("text over the byte cap", INVALID, "--max-prompt-bytes", text="a" * (4 * MIB + 1)),
    _gen("multibyte text over the byte cap", INVALID, "--max-prompt-bytes", text="é" * (2 * MIB + 1)),
    _gen("50 MB message", grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max", text="a" * (50 * MIB)),
    # over the served model's limit, under gRPC's (fixed before the model was known): unparsed
    _gen("6 MB message", grpc.StatusCode.RESOURCE_EXHAUSTED, "this server takes at most", text="a" * (6 * MIB)),
    _gen("chat over the byte cap", INVALID, "--max-prompt-bytes",
         chat=[("user", "a" * (2 * MIB)), ("user", "a" * (2 * MIB))]),
    Hostile("1025 chat messages", _chat_of(1025), INVALID, "--max-chat-messages"),
    Hostile("two million empty chat messages", _chat_of(2_000_000), INVALID, "--max-chat-messages"),
    _gen("2048 token ids", INVALID, "--max-model-len", ids=[5] * 2048),
    _gen("a million token ids", INVALID, "--max-model-len", ids=[5] * 1_000_000),
    _gen("text past the context", INVALID, "--max-model-len", text="Hello world. " * 2000),
    _gen("chat past the context", INVALID, "--max-model-len", chat=[("user", "Hello world. " * 2000)]),
    _gen("17 stop strings", INVALID, "--max-stop-strings", stop=["x"] * 17),
    _gen("4097 bytes of stop strings", INVALID, "--max-stop-bytes", stop=["x" * 4097]),
    _gen("a MB of stop strings", INVALID, "--max-stop-strings", stop=[""] * (MIB // 2)),
    _gen("257 stop token ids", INVALID, "--max-stop-token-ids", stop_token_ids=[5] * 257),
    _gen("long request id", INVALID, "request_id", rid="r" * 257),
    Hostile("tokenize over the byte cap", pb.TokenizeRequest(text="a" * (4 * MIB + 1)), INVALID,
            "--max-prompt-bytes", "Tokenize"),
    Hostile("tokenize past the context", pb.TokenizeRequest(text="Hello world. " * 2000), INVALID,
            "context", "Tokenize"),
    Hostile("tokenize 1025 chat messages", pb.TokenizeRequest(chat=_chat_of(1025).chat), INVALID,
            "--max-chat-messages", "Tokenize"),
    # sampling parameters
    _gen("empty stop string", INVALID, "non-empty", stop=[""]),
    _gen("negative temperature", INVALID, "temperature", temperature=-0.5),
    _gen("NaN temperature", INVALID, "temperature", temperature=NAN),
    _gen("inf temperature", INVALID, "temperature", temperature=INF),
    _gen("-inf temperature", INVALID, "temperature", temperature=-INF),
    _gen("top_p 0", INVALID, "top_p", top_p=0.0),
    _gen("top_p 1.5", INVALID, "top_p", top_p=1.5),
    _gen("top_p NaN", INVALID, "top_p", top_p=NAN),
    _gen("top_p -0.1", INVALID, "top_p", top_p=-0.1),
    _gen("top_p inf", INVALID, "top_p", top_p=INF),
    _gen("top_k -1", INVALID, "top_k", top_k=-1),
    _gen("top_k int32 min", INVALID, "top_k", top_k=-(2**31)),
    _gen("max_tokens 0", INVALID, "max_tokens", max_tokens=0),
    _gen("max_tokens past the context", INVALID, "at most 2046", max_tokens=2047),
    _gen("max_tokens uint32 max", INVALID, "max_tokens", max_tokens=2**32 - 1),
    _gen("token id -1", INVALID, "vocabulary", ids=[5, -1]),
    _gen("token id past the vocabulary", INVALID, "vocabulary", ids=[5, 512]),
    _gen("token id int32 max", INVALID, "vocabulary", ids=[2**31 - 1]),
    _gen("token id int32 min", INVALID, "vocabulary", ids=[-(2**31)]),
    _gen("stop token id -1", INVALID, "stop_token_ids", stop_token_ids=[-1]),
    _gen("stop token id past the vocabulary", INVALID, "stop_token_ids", stop_token_ids=[512]),
    # malformed wire bytes
    Hostile("bad UTF-8 in text", _corrupt(pb.GenerateRequest(text="aXXb"), b"XX", BAD_UTF8), INVALID,
            "bad UTF-8"),
    Hostile("bad UTF-8 in a stop string", _corrupt(pb.GenerateRequest(
        text="hi", params=pb.SamplingParams(stop=["XX"])), b"XX", BAD_UTF8), INVALID, "bad UTF-8"),
    Hostile("bad UTF-8 in chat content", _corrupt(pb.GenerateRequest(chat=pb.ChatMessages(
        messages=[pb.ChatMessage(role="user", content="XX")])), b"XX", BAD_UTF8), INVALID, "bad UTF-8"),
    Hostile("bad UTF-8 in a chat role", _corrupt(pb.GenerateRequest(chat=pb.ChatMessages(
        messages=[pb.ChatMessage(role="XX", content="hi")])), b"XX", BAD_UTF8), INVALID, "bad UTF-8"),
    Hostile("bad UTF-8 in request_id", _corrupt(pb.GenerateRequest(text="hi", request_id="XX"), b"XX",
                                                b"\xc3\x28"), INVALID, "bad UTF-8"),
    Hostile("truncated varint", b"\x22\x02\x08\xff", INVALID, "corrupt"),
    Hostile("truncated length", b"\x0a\x10abc", INVALID, "corrupt"),
    Hostile("overlong varint", b"\x08" + b"\xff" * 11, INVALID, "corrupt"),
    Hostile("garbage bytes", bytes(random.Random(1).getrandbits(8) | 0x80 for _ in range(64)), INVALID,
            "corrupt"),
    Hostile("unbalanced end group", b"\x0c", INVALID, "corrupt"),
    # fields this server's proto lacks (a newer client's) are refused by number, not ignored
    Hostile("unknown field only", b"\x48\x05", INVALID, "#9: field number 9 is unknown to this"),
    Hostile("text with the wrong wire type", b"\x08\x05", INVALID, "#1: field number 1 is unknown to this"),
    Hostile("bad UTF-8 to Tokenize", _corrupt(pb.TokenizeRequest(text="XX"), b"XX", BAD_UTF8), INVALID,
            "bad UTF-8", "Tokenize"),
    Hostile("garbage to Complete", b"\xff" * 32, INVALID, "corrupt", "Complete"),
    Hostile("garbage to GetModelInfo", b"\xff" * 8, INVALID, "corrupt", "GetModelInfo"),
    Hostile("garbage to GetServerStatus", b"\x0b", INVALID, "corrupt", "GetServerStatus"),
    Hostile("an unknown method", b"", grpc.StatusCode.UNIMPLEMENTED, "", "NoSuchMethod"),
    # odd but valid: served
    _gen("seed 0", OK, seed=0, temperature=1.0),
    _gen("seed uint64 max", OK, seed=2**64 - 1, temperature=1.0),
    _gen("tiny temperature", OK, temperature=1e-30, top_k=5),
    _gen("huge temperature", OK, temperature=3e38),
    _gen("top_k int32 max", OK, top_k=2**31 - 1, temperature=1.0),
    _gen("256 stop token ids", OK, stop_token_ids=[0] * 256),
    _gen("NUL bytes in text", OK, text="\x00" * 16),
    _gen("special tokens in text", OK, text="<|eos|><|bos|><|end|>"),
    _gen("template syntax in chat content", OK, chat=[("{{ 7 * 7 }}", "{% for x in range(9**9) %}")]),
    _gen("chat of empty messages", OK, chat=[("", ""), ("", "")]),
    _gen("request id of 256 bytes", OK, rid="r" * 256),
]


def _call(cluster, h: Hostile):
    """Sends the request; returns (status code, details)."""
    streaming = h.rpc == "Generate"
    method = f"/llmserve.v1.LLMServe/{h.rpc}"
    serializer = None if isinstance(h.request, bytes) else type(h.request).SerializeToString
    make = cluster.channel.unary_stream if streaming else cluster.channel.unary_unary
    call = make(method, request_serializer=serializer, response_deserializer=None)
    try:
        result = call(h.request, timeout=60)
        if streaming:
            messages = [pb.GenerateResponse.FromString(m) for m in result]
            assert messages[-1].finish_reason != pb.FINISH_REASON_UNSPECIFIED
            assert sum(len(m.token_ids) for m in messages) >= 1
        return OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details() or ""


def _assert_healthy_and_drained(cluster, reference):
    health = health_pb2_grpc.HealthStub(cluster.channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == \
        health_pb2.HealthCheckResponse.SERVING
    assert generate(cluster.stub, **NORMAL)[0] == reference
    s = cluster.wait_idle()
    assert (s.num_running, s.num_waiting, s.free_blocks) == (0, 0, s.total_blocks)


@pytest.mark.parametrize("hostile", HOSTILE, ids=[h.name for h in HOSTILE])
def test_hostile_request_gets_its_status_and_harms_nothing(cluster, reference, hostile):
    code, details = _call(cluster, hostile)
    assert code == hostile.code, details
    assert hostile.needle in details
    assert "Traceback" not in details and "Exception" not in details
    _assert_healthy_and_drained(cluster, reference)


def test_deadline_already_expired(cluster, reference):
    req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5, 6]), params=pb.SamplingParams(max_tokens=4))
    with pytest.raises(grpc.RpcError) as err:
        list(cluster.stub.Generate(req, timeout=1e-6))
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    _assert_healthy_and_drained(cluster, reference)


def test_cancelled_immediately(cluster, reference):
    for _ in range(5):
        call = cluster.stub.Generate(pb.GenerateRequest(
            token_ids=pb.TokenIds(ids=[5, 6]),
            params=pb.SamplingParams(max_tokens=1500, ignore_eos=True)), timeout=60)
        call.cancel()
        with pytest.raises(grpc.RpcError) as err:
            list(call)
        assert err.value.code() == grpc.StatusCode.CANCELLED
    _assert_healthy_and_drained(cluster, reference)


def _rss_kb(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _large_text(num_bytes: int) -> str:
    rng = random.Random(0)
    words = "The quick brown fox jumps over the lazy dog café 日本語 emoji 🚀 serving".split()
    parts, size = [], 0
    while size < num_bytes:
        w = rng.choice(words)
        parts.append(w)
        size += len(w.encode()) + 1
    return " ".join(parts)[:num_bytes - 8]


def _stream_until(stub, done: threading.Event, stamps: list[float]) -> None:
    """Another client: greedy streams back to back until `done`, stamping every message."""
    req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5, 9, 11]), params=pb.SamplingParams(
        max_tokens=2000, temperature=0.0, ignore_eos=True))
    while not done.is_set():
        call = stub.Generate(req, timeout=120)
        for _ in call:
            stamps.append(time.monotonic())
            if done.is_set():
                call.cancel()
                return


def test_a_large_prompt_never_stalls_another_stream_and_memory_comes_back(cluster, reference):
    api_pid = cluster.procs[1].pid  # the API process (the engine core is its child)
    big = pb.GenerateRequest(text=_large_text(4 * MIB - 64), params=pb.SamplingParams(max_tokens=4))
    assert len(big.text.encode()) <= 4 * MIB
    generate(cluster.stub, text="warm up the tokenizer pool " * 64, max_tokens=1, temperature=0.0)
    rss_before = _rss_kb(api_pid)
    done, stamps = threading.Event(), []
    other = threading.Thread(target=_stream_until, args=(cluster.stub, done, stamps))
    other.start()
    while not stamps:  # streaming has started
        time.sleep(0.01)
    time.sleep(1.0)
    # The stream's own gaps on this machine, before the large request: a 2-core VM losing its
    # CPUs to its host (30% steal measured) stalls every process now and then; a stalled event
    # loop would not stream for the ~9 s tokenizing 4 MiB takes here.
    quiet = max((b - a for a, b in zip(stamps[1:], stamps[2:])), default=0.0)
    start = time.monotonic()
    try:
        with pytest.raises(grpc.RpcError) as err:  # refused untokenized (far over the context)
            cluster.stub.Complete(big, timeout=120)
        end = time.monotonic()
        time.sleep(0.2)  # one more message after the large request ended
    finally:
        done.set()
        other.join()
    assert err.value.code() == INVALID and "--max-model-len" in err.value.details()
    assert stamps[-1] > end
    during = [b - a for a, b in zip(stamps, stamps[1:]) if b >= start and a <= end]
    assert not during or max(during) < max(1.0, 5 * quiet), (max(during), quiet, end - start)
    rss_growth_mb = (_rss_kb(api_pid) - rss_before) / 1024
    assert rss_growth_mb < 64, f"the API process kept {rss_growth_mb:.0f} MB after the request"
    _assert_healthy_and_drained(cluster, reference)
