"""Both services as real processes: outputs token-exact with transformers, load, cancellation."""

import concurrent.futures as cf
import random
import time
import urllib.request

import grpc
import pytest

from protos.llmserve.v1 import llmserve_pb2 as pb
from benchmarks.cluster import free_port, generate
from tests.integration.conftest import start_cluster


def _prompts(n, seed, vocab=500, lo=3, hi=40):
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def _run_concurrently(stub, prompts, max_tokens, **params):
    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        futures = [pool.submit(generate, stub, prompt_ids=p, max_tokens=m, temperature=0.0, **params)
                   for p, m in zip(prompts, max_tokens)]
        return [f.result()[0] for f in futures]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_greedy_matches_transformers_in_shared_batches(arch, model_dirs, hf_greedy, tmp_path_factory, request):
    own = arch != "llama"  # llama with every flag at its default: the package's cluster
    cluster = start_cluster(tmp_path_factory, model_dirs[arch], arch) if own else request.getfixturevalue("llama_cluster")
    try:
        prompts = _prompts(6, seed=1)
        max_tokens = [5, 17, 9, 24, 12, 30]
        got = _run_concurrently(cluster.stub, prompts, max_tokens)
        for p, m, ids in zip(prompts, max_tokens, got):
            assert ids == hf_greedy(arch, p, m)
        assert cluster.wait_idle().free_blocks == cluster.status().total_blocks
    finally:
        if own:
            cluster.stop()


def test_preemption_keeps_outputs_exact(model_dirs, hf_greedy, tmp_path_factory):
    # 24 usable blocks of 16 tokens cannot hold 8 requests of ~100 tokens: some are preempted.
    cluster = start_cluster(tmp_path_factory, model_dirs["llama"], "preempt",
                            executor_args=["--num-kv-blocks", "25"])
    try:
        prompts = _prompts(8, seed=2, lo=20, hi=40)
        max_tokens = [60] * 8
        got = _run_concurrently(cluster.stub, prompts, max_tokens)
        for p, m, ids in zip(prompts, max_tokens, got):
            assert ids == hf_greedy("llama", p, m)
        status = cluster.wait_idle()
        assert (status.total_blocks, status.free_blocks) == (24, 24)
        assert "preempt" in cluster.logs(tail=None).lower()
    finally:
        cluster.stop()


def test_64_concurrent_streams(llama_cluster, hf_greedy):
    prompts = _prompts(64, seed=3, lo=2, hi=20)
    max_tokens = [random.Random(i).randint(1, 12) for i in range(64)]
    got = _run_concurrently(llama_cluster.stub, prompts, max_tokens, ignore_eos=True)
    for p, m, ids in zip(prompts, max_tokens, got):
        ref = hf_greedy("llama", p, m)
        assert ids[: len(ref)] == ref and len(ids) == m
    assert llama_cluster.wait_idle().free_blocks == llama_cluster.status().total_blocks


def test_cancel_frees_exactly_the_requests_blocks(llama_cluster):
    stub = llama_cluster.stub
    base = llama_cluster.wait_idle()
    prompt = list(range(10, 10 + 40))  # 40 prompt tokens
    call = stub.Generate(pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=prompt),
        params=pb.SamplingParams(max_tokens=1500, temperature=0.0, ignore_eos=True)))
    received = 0
    for msg in call:
        received += len(msg.token_ids)
        if received >= 30:
            break
    held = llama_cluster.status()
    assert held.num_running == 1
    # 40 prompt + at least 30 generated tokens: at least ceil(70 / 16) = 5 blocks held.
    assert base.free_blocks - held.free_blocks >= 5
    call.cancel()
    after = llama_cluster.wait_idle()
    assert after.free_blocks == base.free_blocks == after.total_blocks
    assert after.num_running == 0
    # The server keeps serving.
    ids, _, last = generate(stub, prompt_ids=[5, 6, 7], max_tokens=4, temperature=0.0, ignore_eos=True)
    assert len(ids) == 4 and last.finish_reason == pb.FINISH_REASON_LENGTH


def test_finish_reasons_usage_and_stop_token(llama_cluster):
    stub = llama_cluster.stub
    ids, _, last = generate(stub, prompt_ids=[5, 9, 11], max_tokens=8, temperature=0.0, ignore_eos=True)
    assert last.finish_reason == pb.FINISH_REASON_LENGTH
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (3, 8)
    stop_id = ids[3]
    first = ids.index(stop_id)
    ids2, _, last2 = generate(stub, prompt_ids=[5, 9, 11], max_tokens=8, temperature=0.0,
                              ignore_eos=True, stop_token_ids=[stop_id])
    assert ids2 == ids[: first + 1]
    assert last2.finish_reason == pb.FINISH_REASON_STOP


def test_stop_string_cuts_text(llama_cluster):
    stub = llama_cluster.stub
    _, text, _ = generate(stub, text="Hello", max_tokens=24, temperature=0.0, ignore_eos=True)
    assert len(text) > 6
    stop = text[3:6]
    _, cut, last = generate(stub, text="Hello", max_tokens=24, temperature=0.0, ignore_eos=True, stop=[stop])
    assert cut == text[: text.index(stop)]
    assert last.finish_reason == pb.FINISH_REASON_STOP and last.matched_stop == stop


def test_complete_equals_stream_and_seeded_sampling_repeats(llama_cluster):
    stub = llama_cluster.stub
    req = pb.GenerateRequest(text="The quick brown fox", params=pb.SamplingParams(
        max_tokens=12, temperature=0.8, top_p=0.9, top_k=50, seed=1234, ignore_eos=True))
    (full,) = stub.Complete(req, timeout=60).choices
    streamed = list(stub.Generate(req, timeout=60))
    assert list(full.token_ids) == [t for m in streamed for t in m.token_ids]
    assert full.text == "".join(m.text for m in streamed)
    (again,) = stub.Complete(req, timeout=60).choices
    assert list(again.token_ids) == list(full.token_ids)


def test_chat_tokenize_and_model_info(llama_cluster):
    stub = llama_cluster.stub
    chat = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="hi")])
    tok = stub.Tokenize(pb.TokenizeRequest(chat=chat))
    assert len(tok.token_ids) == len(tok.tokens) > 3
    out = stub.Complete(pb.GenerateRequest(chat=chat, params=pb.SamplingParams(max_tokens=3, temperature=0)))
    assert out.usage.prompt_tokens == len(tok.token_ids)
    info = stub.GetModelInfo(pb.GetModelInfoRequest())
    assert (info.vocab_size, info.max_model_len, info.block_size) == (512, 2048, 16)


@pytest.mark.parametrize("params,prompt,needle", [
    (dict(max_tokens=4), [], "empty"),
    (dict(max_tokens=4), [5] * 2048, "context"),
    (dict(max_tokens=0), [5, 6], "max_tokens"),
    (dict(max_tokens=2047), [5, 6], "max_tokens"),
    (dict(max_tokens=4, temperature=-0.5), [5, 6], "temperature"),
    (dict(max_tokens=4, top_p=0.0), [5, 6], "top_p"),
    (dict(max_tokens=4, top_p=1.5), [5, 6], "top_p"),
    (dict(max_tokens=4, top_k=-1), [5, 6], "top_k"),
    (dict(max_tokens=4), [5, 512], "vocabulary"),
    (dict(max_tokens=4), [5, -3], "vocabulary"),
])
def test_invalid_requests_get_invalid_argument(llama_cluster, params, prompt, needle):
    req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=prompt), params=pb.SamplingParams(**params))
    with pytest.raises(grpc.RpcError) as err:
        list(llama_cluster.stub.Generate(req, timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in err.value.details()
    ids, _, _ = generate(llama_cluster.stub, prompt_ids=[5, 6], max_tokens=2, temperature=0.0)
    assert len(ids) >= 1


def test_no_input_is_invalid(llama_cluster):
    with pytest.raises(grpc.RpcError) as err:
        llama_cluster.stub.Complete(pb.GenerateRequest(), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_health_and_reflection(llama_cluster):
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    stub = reflection_pb2_grpc.ServerReflectionStub(llama_cluster.channel)
    responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {s.name for r in responses for s in r.list_services_response.service}
    assert {"llmserve.v1.LLMServe", "grpc.health.v1.Health"} <= names


def test_stream_interval_groups_tokens_and_metrics(llama_cluster, model_dirs, tmp_path_factory):
    metrics_port = free_port()
    grouped = start_cluster(tmp_path_factory, model_dirs["llama"], "interval",
                            scheduler_args=["--stream-interval", "4", "--metrics-port", str(metrics_port)])
    try:
        req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5, 9, 11, 13]), params=pb.SamplingParams(
            max_tokens=14, temperature=0.0, ignore_eos=True))
        messages = list(grouped.stub.Generate(req, timeout=60))
        reference = list(llama_cluster.stub.Generate(req, timeout=60))
        # The promise of --stream-interval 4: every message but the last carries at least 4
        # tokens; a stream that falls behind gets more per message (queued outputs fold), so
        # the exact grouping depends on timing, never the tokens or their order.
        counts = [len(m.token_ids) for m in messages]
        assert sum(counts) == 14 and all(n >= 4 for n in counts[:-1]) and counts[-1] >= 1
        assert len(messages) <= 4
        assert [t for m in messages for t in m.token_ids] == [t for m in reference for t in m.token_ids]
        assert "".join(m.text for m in messages) == "".join(m.text for m in reference)
        assert messages[-1].finish_reason == pb.FINISH_REASON_LENGTH
        status = grouped.wait_idle()
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        assert f"llmserve_kv_blocks_total {float(status.total_blocks)}" in metrics
        assert f"llmserve_steps_total {float(status.num_steps)}" in metrics
    finally:
        grouped.stop()


def test_executor_restart_fails_streams_then_recovers(model_dirs, tmp_path_factory):
    cluster = start_cluster(tmp_path_factory, model_dirs["llama"], "restart")
    try:
        long_req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5, 6, 7]), params=pb.SamplingParams(
            max_tokens=1500, temperature=0.0, ignore_eos=True))
        call = cluster.stub.Generate(long_req, timeout=60)
        next(call)  # streaming has started
        cluster.restart_executor()
        with pytest.raises(grpc.RpcError) as err:
            list(call)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        deadline = time.monotonic() + 60
        while True:  # refused with UNAVAILABLE until the new executor is up, then served again
            try:
                ids, _, last = generate(cluster.stub, prompt_ids=[5, 6, 7], max_tokens=5, temperature=0.0,
                                        ignore_eos=True, timeout=30)
                break
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline
                time.sleep(0.5)
        assert len(ids) == 5 and last.finish_reason == pb.FINISH_REASON_LENGTH
        status = cluster.wait_idle()
        assert status.free_blocks == status.total_blocks
    finally:
        cluster.stop()


def test_cancellation_storm_leaks_nothing_and_harms_no_other_request(llama_cluster, hf_greedy):
    stub = llama_cluster.stub
    base = llama_cluster.wait_idle()
    rng = random.Random(5)
    prompts = _prompts(32, seed=6, lo=5, hi=60)
    calls = [stub.Generate(pb.GenerateRequest(token_ids=pb.TokenIds(ids=p), params=pb.SamplingParams(
        max_tokens=400, temperature=0.0, ignore_eos=True))) for p in prompts[:24]]

    def consume_then_cancel(call, after):
        got = 0
        for msg in call:
            got += len(msg.token_ids)
            if got >= after:
                call.cancel()
                return

    with cf.ThreadPoolExecutor(32) as pool:
        cancels = [pool.submit(consume_then_cancel, c, rng.randint(1, 40)) for c in calls]
        kept = [pool.submit(generate, stub, prompt_ids=p, max_tokens=12, temperature=0.0, ignore_eos=True)
                for p in prompts[24:]]
        for f in cancels:
            f.result()
        kept_ids = [f.result()[0] for f in kept]
    for p, ids in zip(prompts[24:], kept_ids):
        ref = hf_greedy("llama", p, 12)  # transformers stops at EOS; ours ignores it
        assert len(ids) == 12 and ids[: len(ref)] == ref
    after = llama_cluster.wait_idle()
    assert (after.free_blocks, after.num_running, after.num_waiting) == (base.free_blocks, 0, 0)


def test_fresh_small_server_status_and_a_request_too_big_for_its_cache(model_dirs, tmp_path_factory):
    fresh = start_cluster(tmp_path_factory, model_dirs["qwen2"], "fresh", executor_args=["--num-kv-blocks", "50"])
    try:
        s = fresh.status()
        assert (s.total_blocks, s.free_blocks, s.used_blocks, s.num_running, s.num_waiting) == (49, 49, 0, 0, 0)
        # 10 + 1000 tokens need 64 blocks of 16; the cache holds 49.
        too_big = pb.GenerateRequest(token_ids=pb.TokenIds(ids=list(range(3, 13))),
                                     params=pb.SamplingParams(max_tokens=1000))
        with pytest.raises(grpc.RpcError) as err:
            list(fresh.stub.Generate(too_big, timeout=30))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "64 KV blocks" in err.value.details() and "49" in err.value.details()
        ids, _, _ = generate(fresh.stub, prompt_ids=list(range(3, 13)), max_tokens=700, temperature=0.0,
                             ignore_eos=True)
        assert len(ids) == 700  # 710 tokens = 45 blocks: fits
    finally:
        fresh.stop()
