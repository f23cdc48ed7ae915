"""The smoke test's client: streams one completion through the public port and checks it.

python deploy/smoke_client.py [ADDRESS]   (default 127.0.0.1:50051; run from the repository root,
or anywhere the `protos` package is importable: it uses the generated stubs in protos/llmserve/v1).
Exits 0 when the server is SERVING, reports a model, and Generate streams tokens to a finish
reason, twice (the first request warms the executor up); prints what it saw and the times to
the first token and to the end of each stream. An API key is sent when
LLMSERVE_API_KEY is set.
"""

from __future__ import annotations

import os
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos.llmserve.v1 import llmserve_pb2 as pb
from protos.llmserve.v1 import llmserve_pb2_grpc as pb_grpc

PROMPT = "What is the capital of France?"
MAX_TOKENS = 24


def main(argv: list[str]) -> int:
    address = argv[0] if argv else "127.0.0.1:50051"
    key = os.environ.get("LLMSERVE_API_KEY", "")
    metadata = (("authorization", f"Bearer {key}"),) if key else None
    with grpc.insecure_channel(address) as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(health.status)
        print(f"health: {status}")
        if health.status != health_pb2.HealthCheckResponse.SERVING:
            return fail("the server is not SERVING")
        stub = pb_grpc.LLMServeStub(channel)
        info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10, metadata=metadata)
        print(f"model: {info.model_name} (max_model_len {info.max_model_len}, vocab {info.vocab_size})")
        if not info.model_name:
            return fail("no model name")
        for attempt in ("first (warm-up)", "second"):
            ok = stream_once(stub, metadata, attempt)
            if ok:
                return ok
    print("client: OK")
    return 0


def stream_once(stub, metadata, label: str) -> int:
    """One streamed chat completion, checked; 0 when it passed."""
    chat = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=PROMPT)])
    request = pb.GenerateRequest(chat=chat, params=pb.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0))
    t0 = time.perf_counter()
    first = None
    messages = tokens = 0
    text = []
    last = None
    for msg in stub.Generate(request, timeout=120, metadata=metadata):
        if msg.token_ids and first is None:
            first = time.perf_counter() - t0
        messages += 1
        tokens += len(msg.token_ids)
        text.append(msg.text)
        last = msg
    total = time.perf_counter() - t0
    print(f"{label} request: {PROMPT!r} -> {''.join(text)!r}")
    if last is None or not last.finish_reason:
        return fail("the stream ended without a finish reason")
    print(f"  {messages} messages, {tokens} tokens, {pb.FinishReason.Name(last.finish_reason)}, "
          f"usage {last.usage.prompt_tokens} prompt + {last.usage.completion_tokens} generated; "
          f"first token {first * 1000 if first is not None else float('nan'):.0f} ms, "
          f"whole stream {total * 1000:.0f} ms")
    if tokens == 0 or first is None:
        return fail("no token arrived")
    if last.usage.completion_tokens != tokens:
        return fail(f"usage says {last.usage.completion_tokens} tokens, the stream carried {tokens}")
    return 0


def fail(why: str) -> int:
    print(f"client: FAILED: {why}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
