"""The vLLM-named metrics through both services: scraped from --metrics-port while and after a
known set of requests runs, the counters checked exactly against what was sent and streamed;
and the logs operators expect (a stats line, one access line per request, one format in all
processes)."""

import concurrent.futures as cf
import re
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.cluster import free_port, generate
from protos.llmserve.v1 import llmserve_pb2 as pb
from scheduler_svc.api.access_log import parse_line
from tests.integration.conftest import start_cluster

PROMPTS = [[(5 * i + 3 * j) % 300 + 3 for j in range(n)] for i, n in enumerate([4, 9, 17, 30, 12, 6])]
MAX_TOKENS = [3, 8, 1, 12, 5, 20]


def _scrape(port: int) -> dict:
    """name -> [(labels, value)] of every sample."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name].append((s.labels, s.value))
    return out


def _total(samples: dict, name: str) -> float:
    return sum(v for _, v in samples[name])


def test_metrics_match_the_requests_sent_and_logs_are_written(model_dirs, tmp_path_factory):
    port = free_port()
    cluster = start_cluster(tmp_path_factory, model_dirs["llama"], "metrics", (),
                            ["--metrics-port", str(port), "--log-stats-interval", "0.5"])
    try:
        with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
            futures = [pool.submit(generate, cluster.stub, prompt_ids=p, max_tokens=m, temperature=0.0,
                                   ignore_eos=True) for p, m in zip(PROMPTS, MAX_TOKENS)]
            during = _scrape(port)  # while they run: parses, has the families
            streamed = [len(f.result()[0]) for f in futures]
        assert streamed == MAX_TOKENS
        cluster.wait_idle()
        s = _scrape(port)
        n, tokens, prompt = len(PROMPTS), sum(streamed), sum(map(len, PROMPTS))
        assert "llmserve:num_requests_running" in during
        models = {labels["model_name"] for name, samples in s.items() if name.startswith("llmserve:")
                  for labels, _ in samples}  # every one has the label
        assert models == {model_dirs["llama"].name}  # the executor's model name
        assert _total(s, "llmserve:request_success_total") == n
        by_reason = {labels["finished_reason"]: v for labels, v in s["llmserve:request_success_total"]}
        assert by_reason["length"] == n and by_reason["stop"] == by_reason["abort"] == 0
        assert _total(s, "llmserve:generation_tokens_total") == tokens
        assert _total(s, "llmserve:prompt_tokens_total") == prompt
        for name in ["time_to_first_token_seconds", "e2e_request_latency_seconds",
                     "request_queue_time_seconds", "request_prefill_time_seconds",
                     "request_decode_time_seconds", "request_inference_time_seconds",
                     "request_prompt_tokens", "request_generation_tokens"]:
            assert _total(s, f"llmserve:{name}_count") == n, name
        assert _total(s, "llmserve:request_prompt_tokens_sum") == prompt
        assert _total(s, "llmserve:request_generation_tokens_sum") == tokens
        assert _total(s, "llmserve:inter_token_latency_seconds_count") == tokens - n  # one a token
        assert _total(s, "llmserve:time_per_output_token_seconds_count") == tokens - n
        assert _total(s, "llmserve:num_requests_running") == _total(s, "llmserve:num_requests_waiting") == 0
        assert _total(s, "llmserve:kv_cache_usage_perc") == 0
        assert _total(s, "llmserve:num_preemptions_total") == 0
        steps = _total(s, "llmserve:executor_steps_total")
        assert steps >= max(MAX_TOKENS)
        assert _total(s, "llmserve:executor_step_time_seconds_count") == steps
        assert _total(s, "llmserve:executor_busy_seconds_total") > 0
        assert _total(s, "llmserve:prefix_cache_queries_total") == prompt
        call = cluster.stub.Generate(pb.GenerateRequest(
            token_ids=pb.TokenIds(ids=[5, 6, 7]), params=pb.SamplingParams(max_tokens=500, ignore_eos=True)))
        next(call)  # its first token came: cancel it
        call.cancel()
        cluster.wait_idle()
        a = _scrape(port)
        by_reason = {labels["finished_reason"]: v for labels, v in a["llmserve:request_success_total"]}
        assert by_reason["abort"] == 1 and _total(a, "llmserve:request_success_total") == n + 1
        assert _total(a, "llmserve:e2e_request_latency_seconds_count") == n + 1
        time.sleep(1.2)  # a stats line is due
        executor_log, scheduler_log = (Path(f.name).read_text() for f in cluster._logs)
    finally:
        cluster.stop()
    access = [parse_line(m) for m in re.findall(r"INFO llmserve\.access: (.*)", scheduler_log)]
    generates = [f for f in access if f["method"] == "Generate"]  # (GetServerStatus has lines too)
    assert len(generates) == n + 1
    finished = sorted((int(f["prompt_tokens"]), int(f["output_tokens"])) for f in generates
                      if f["status"] == "OK")
    assert finished == sorted(zip(map(len, PROMPTS), MAX_TOKENS))  # each request's own counts
    cancelled = [f for f in generates if f["status"] == "CANCELLED"]
    assert len(cancelled) == 1 and cancelled[0]["outcome"] == "cancelled"
    assert int(cancelled[0]["prompt_tokens"]) == 3 and int(cancelled[0]["output_tokens"]) >= 1
    assert all(float(f["duration_ms"]) >= float(f["ttft_ms"]) > 0 for f in generates)
    assert re.search(r"engine-core\[\d+\] INFO llmserve.engine_core: Avg prompt throughput: [0-9.]+ "
                     r"tokens/s, Avg generation throughput: [0-9.]+ tokens/s, Running: \d+ reqs, "
                     r"Waiting: \d+ reqs, KV cache usage: [0-9.]+%, Prefix cache hit rate: [0-9.]+%",
                     scheduler_log)
    assert f"serving Prometheus metrics on http://0.0.0.0:{port}/metrics" in scheduler_log
    line = re.compile(r"^\S+ \S+ (scheduler|engine-core|executor)\[\d+\] [A-Z]+ \S+: ", re.M)
    assert line.search(executor_log) and line.search(scheduler_log)
