"""Bounded cost per request with the default flags: streams whose clients never read are cut
(RESOURCE_EXHAUSTED, their slots and KV blocks freed) on both doors while a normal client is
served token-exact and a fast reader of a long generation is never cut; the largest accepted
prompt, far over the context, is refused before it is tokenized, and the API process's memory
stays where it was."""

from __future__ import annotations

import json
import socket
import sys
import time
import urllib.error
import urllib.request

import grpc
import pytest

from benchmarks.cluster import generate
from benchmarks.slow_readers import SMALL_WINDOW
from protos.llmserve.v1 import llmserve_pb2 as pb
from protos.llmserve.v1 import llmserve_pb2_grpc as pb_grpc
from tests.integration.conftest import start_cluster

MIB = 1 << 20
HOGS = 30
NORMAL = dict(prompt_ids=[9, 8, 7], max_tokens=40, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def cluster(model_dirs, tmp_path_factory):
    c = start_cluster(tmp_path_factory, model_dirs["llama"], "bounded", http=True)  # every limit at its default
    yield c
    c.stop()


def _hog(stub, i: int):
    return stub.Generate(pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5, 6, 7 + i]), params=pb.SamplingParams(
        max_tokens=1900, temperature=0.0, ignore_eos=True)), timeout=120)


def test_never_reading_streams_are_cut_and_their_blocks_return(cluster):
    reference, _, _ = generate(cluster.stub, **NORMAL)
    steps_before = cluster.status().num_steps
    # Windows that fill after ~1 KiB unread (a default grpc client grows its window by BDP
    # probing, so the server's writes block only after a few hundred KB: the same, later).
    channels = [grpc.insecure_channel(cluster.address, options=SMALL_WINDOW) for _ in range(HOGS)]
    try:
        calls = [_hog(pb_grpc.LLMServeStub(ch), i) for i, ch in enumerate(channels)]
        ids, _, last = generate(cluster.stub, **NORMAL)
        assert ids == reference and last.finish_reason == pb.FINISH_REASON_LENGTH
        status = cluster.wait_idle(timeout=30)  # while the calls are still open and unread
        assert (status.num_running, status.free_blocks) == (0, status.total_blocks)
        assert status.num_steps - steps_before < 1800  # cut long before their 1900 tokens
        for call in calls:
            with pytest.raises(grpc.RpcError) as err:
                for _ in call:
                    pass
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "read too slowly" in err.value.details() and "--max-stream-stall" in err.value.details()
        assert "the client read too slowly" in cluster.logs(tail=None)
        assert generate(cluster.stub, **NORMAL)[0] == reference
    finally:
        for ch in channels:
            ch.close()


def test_a_never_reading_sse_stream_is_cut(cluster):
    steps_before = cluster.status().num_steps
    # 32 samples: ~12 MB of events, over what the kernel buffers on loopback (up to 4 MiB
    # of send buffer) and the server's transport hold, so the server's writes block.
    body = json.dumps({"prompt": "hello there", "max_tokens": 1900, "stream": True, "n": 32,
                       "ignore_eos": True}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small TCP window
    try:
        sock.connect(("127.0.0.1", cluster.http_port))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(body), body))  # and never reads
        deadline = time.monotonic() + 30
        while cluster.status().num_steps == steps_before and time.monotonic() < deadline:
            time.sleep(0.05)
        # The server's writes block only once ~12 MB of events fill the transports: after ~600
        # steps (n = 32), which take ~15 s on a quiet 2-core machine and twice that under load,
        # so the wait is bounded in steps, not seconds: cut, the blocks return; never cut, the
        # request runs its 1900 steps (~50 s here) and the step count fails.
        status = cluster.wait_idle(timeout=150)
        assert (status.num_running, status.free_blocks) == (0, status.total_blocks)
        assert status.num_steps - steps_before < 1800
    finally:
        sock.close()


def test_a_fast_reader_of_a_long_generation_is_never_cut(cluster):
    # 4x the default --max-stream-backlog (256): a reader that keeps up is never behind it
    ids, _, last = generate(cluster.stub, prompt_ids=[4, 5, 6], max_tokens=1024, temperature=0.0,
                            ignore_eos=True)
    assert len(ids) == 1024 and last.finish_reason == pb.FINISH_REASON_LENGTH
    with urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{cluster.http_port}/v1/completions", json.dumps({
                "prompt": "hello", "max_tokens": 1024, "stream": True, "ignore_eos": True}).encode(),
            {"content-type": "application/json"}), timeout=120) as response:
        events = [line for line in response.read().decode().splitlines() if line.startswith("data: {")]
    assert len(events) >= 1024 // 64 and json.loads(events[-1][6:])["choices"][0]["finish_reason"] == "length"


def _rss_kb(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_largest_prompt_is_refused_untokenized_and_memory_stays(cluster):
    api_pid = cluster.procs[1].pid
    unit = "The quick brown fox jumps over the lazy dog café 日本語 🚀 "
    text = unit * ((4 * MIB - 64) // len(unit.encode()))
    assert len(text.encode()) <= 4 * MIB
    big = pb.GenerateRequest(text=text, params=pb.SamplingParams(max_tokens=4))
    chat = pb.GenerateRequest(chat=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=text)]),
                              params=pb.SamplingParams(max_tokens=4))
    generate(cluster.stub, text="warm up the tokenizer pool " * 64, max_tokens=1, temperature=0.0)
    rss_before = _rss_kb(api_pid)
    for request in [big, chat] * 3:
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            cluster.stub.Complete(request, timeout=60)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = err.value.details()
        assert "the prompt has at least" in details and "context" in details and "--max-model-len" in details
        assert time.monotonic() - start < 10
    for _ in range(3):  # the HTTP door refuses it as early
        request = urllib.request.Request(f"http://127.0.0.1:{cluster.http_port}/v1/completions",
                                         json.dumps({"prompt": text, "max_tokens": 4}).encode(),
                                         {"content-type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=60)
        assert err.value.code == 400
        message = json.loads(err.value.read())["error"]["message"]
        assert "the prompt has at least" in message and "context" in message
    # The heap is trimmed a moment after each large request (api/memory.py).
    deadline = time.monotonic() + 5
    while (growth_mb := (_rss_kb(api_pid) - rss_before) / 1024) >= 64 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert growth_mb < 64, f"the API process grew by {growth_mb:.0f} MB over 9 refused 4 MiB prompts"
    s = cluster.wait_idle()
    assert (s.num_running, s.free_blocks) == (0, s.total_blocks)
