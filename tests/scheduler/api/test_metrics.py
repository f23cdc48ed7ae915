"""The metrics object on its own: request hooks, the engine snapshot collector, the dashboard's
references, the engine core's step histogram and stats line."""

import json
import re
from pathlib import Path
from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from scheduler_svc.api.metrics import Metrics, metrics_content_type, token_buckets
from scheduler_svc.core.outputs import RequestOutput
from scheduler_svc.core.request import FinishReason
from scheduler_svc.engine.stats import STEP_TIME_BUCKETS, EngineStats, StatsLogger
from scheduler_svc.messages import CoreStats
from step_protocol.domain import StepPlan, StepResult

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy/grafana/llmserve-dashboard.json"


def _samples(metrics: Metrics) -> dict:
    """(sample name, frozenset of labels) -> value."""
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _out(req_id, tokens, reason=None, num_prompt=3, num_output=1):
    return RequestOutput(req_id, tokens, "", reason, "", num_prompt, num_output)


def _bound(stats=None) -> Metrics:
    m = Metrics()
    m.bind(SimpleNamespace(stats=stats or CoreStats()), "tiny", 100)
    return m


def test_request_events_give_vllm_named_counters_and_histograms():
    m = _bound()
    m.arrived(range(1, 3), 3, now=10.0)  # two samples of a 3-token prompt
    m.scheduled(1, 10.5)
    m.scheduled(2, 10.5)
    m.scheduled(1, 99.0)  # resumed after a preemption: the first time counts
    m.output(_out(1, [7]), 11.0)
    m.output(_out(2, [8]), 11.0)
    m.output(_out(1, [9], FinishReason.EOS, num_output=2), 11.5)
    m.ended(2, failed=False, now=12.0)  # the client left
    m.ended(1, failed=True, now=12.0)  # already finished: ignored
    s = _samples(m)
    model = ("model_name", "tiny")
    assert s[("llmserve:prompt_tokens_total", frozenset([model]))] == 6
    assert s[("llmserve:generation_tokens_total", frozenset([model]))] == 3
    for reason, n in [("stop", 1), ("abort", 1), ("length", 0), ("error", 0)]:
        assert s[("llmserve:request_success_total", frozenset([model, ("finished_reason", reason)]))] == n
    assert s[("llmserve:time_to_first_token_seconds_count", frozenset([model]))] == 2
    assert s[("llmserve:time_to_first_token_seconds_sum", frozenset([model]))] == 2.0
    assert s[("llmserve:inter_token_latency_seconds_sum", frozenset([model]))] == 0.5
    assert s[("llmserve:e2e_request_latency_seconds_sum", frozenset([model]))] == 1.5 + 2.0
    assert s[("llmserve:request_queue_time_seconds_sum", frozenset([model]))] == 1.0
    assert s[("llmserve:request_prefill_time_seconds_sum", frozenset([model]))] == 1.0
    assert s[("llmserve:request_decode_time_seconds_sum", frozenset([model]))] == 0.5
    assert s[("llmserve:request_generation_tokens_sum", frozenset([model]))] == 3
    assert s[("llmserve:request_prompt_tokens_count", frozenset([model]))] == 2
    assert metrics_content_type.startswith("text/plain")


def test_engine_snapshot_gauges_counters_and_step_histogram():
    stats = CoreStats(num_total_blocks=10, num_free_blocks=4, num_running=3, num_waiting=2,
                      prefix_cache_queries=88, prefix_cache_hits=32, num_preemptions=5)
    es = EngineStats(stats)
    for us, graph in [(800, 0), (3000, 4), (3000, 4), (10_000_000, 0)]:  # 0.8 ms, 3 ms, 3 ms, 10 s
        es.on_result(StepResult(0, prepare_us=0, forward_us=us, sample_us=0, graph_size=graph))
    es.on_plan(StepPlan(step_id=0, preempted_req_ids=[4, 5]))
    assert es.take_scheduled() == []
    s = _samples(_bound(stats))
    model = ("model_name", "tiny")
    one = frozenset([model])
    assert s[("llmserve:num_requests_running", one)] == 3
    assert s[("llmserve:num_requests_waiting", one)] == 2
    assert abs(s[("llmserve:kv_cache_usage_perc", one)] - 0.6) < 1e-12
    assert s[("llmserve:prefix_cache_queries_total", one)] == 88
    assert s[("llmserve:prefix_cache_hits_total", one)] == 32
    assert s[("llmserve:num_preemptions_total", one)] == 7
    assert s[("llmserve:executor_steps_total", frozenset([model, ("mode", "graph")]))] == 2
    assert s[("llmserve:executor_steps_total", frozenset([model, ("mode", "eager")]))] == 2
    assert abs(s[("llmserve:executor_busy_seconds_total", one)] - 10.0068) < 1e-9
    assert s[("llmserve:executor_step_time_seconds_bucket", frozenset([model, ("le", "0.001")]))] == 1
    assert s[("llmserve:executor_step_time_seconds_bucket", frozenset([model, ("le", "0.005")]))] == 3
    assert s[("llmserve:executor_step_time_seconds_bucket", frozenset([model, ("le", "5.0")]))] == 3
    assert s[("llmserve:executor_step_time_seconds_count", one)] == 4
    assert s[("llmserve_prefix_cache_queries_total", frozenset())] == 88  # the older names stay
    assert len(STEP_TIME_BUCKETS) + 1 == len(stats.step_time_counts)


def test_dashboard_parses_and_references_only_exported_metrics():
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    assert len(dashboard["panels"]) >= 10
    referenced = {n for e in exprs for n in re.findall(r"llmserve:[a-z0-9_]+", e)}
    exported = {name for name, _ in _samples(_bound())}
    assert referenced and referenced <= exported, referenced - exported


def test_token_buckets_are_1_2_5_up_to_max_model_len():
    assert token_buckets(100) == [1, 2, 5, 10, 20, 50, 100]
    assert token_buckets(4096)[-1] == 2000


def test_stats_line_only_after_activity():
    stats = CoreStats(num_total_blocks=100, num_free_blocks=75, prefix_cache_queries=0)
    es = EngineStats(stats)
    logger = StatsLogger(es, 10.0)
    assert logger.line() is None
    es.on_outputs([_out(1, [5], num_prompt=40, num_output=1), _out(2, [6], num_output=4)])
    stats.num_steps, stats.num_running = 1, 2
    stats.prefix_cache_queries, stats.prefix_cache_hits = 40, 10
    line = logger.line()
    assert "Running: 2 reqs, Waiting: 0 reqs, KV cache usage: 25.0%, Prefix cache hit rate: 25.0%" in line
    assert line.startswith("Avg prompt throughput: ") and "Avg generation throughput: " in line
    stats.num_running = 0
    assert logger.line() is None


def test_the_batched_gap_histogram_exposes_what_prometheus_client_would_under_both_names():
    import random

    from prometheus_client import CollectorRegistry, Histogram

    from scheduler_svc.api.metrics import ITL_BUCKETS
    from scheduler_svc.api.metrics_hist import BatchHistogram

    rng = random.Random(5)
    values = [rng.choice([0.0, 0.01, 0.3, 80.0, 81.0]) if i % 3 == 0 else rng.expovariate(4.0) for i in range(500)]
    ref_registry, ours = CollectorRegistry(), CollectorRegistry()
    ref = Histogram("x", "d", ["model_name"], registry=ref_registry, buckets=ITL_BUCKETS).labels("m")
    for v in values:
        ref.observe(v)
    hist = BatchHistogram([("x", "d"), ("y", "d")], ITL_BUCKETS, "m")
    ours.register(hist)
    hist.observe_many(values[:123])
    hist.observe_many([])
    hist.observe_many(values[123:])

    def samples(registry, name):
        return {(s.name.replace(name, "x"), tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(generate(registry)) for s in f.samples
                if s.name.startswith(name) and not s.name.endswith("_created")}

    from prometheus_client import generate_latest

    def generate(registry):
        return generate_latest(registry).decode()

    want = samples(ref_registry, "x")
    assert len(want) == len(ITL_BUCKETS) + 3  # the buckets, +Inf, _count, _sum
    for name in ("x", "y"):
        got = samples(ours, name)
        assert got.keys() == want.keys()
        for key, value in want.items():
            assert abs(got[key] - value) <= 1e-9 * max(1.0, abs(value)), key
