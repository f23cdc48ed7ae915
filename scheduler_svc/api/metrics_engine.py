"""Scrape-time metrics read from the engine core's last CoreStats snapshot: load gauges, prefix
cache, preemptions and the executor's step figures (docs/metrics.md). Nothing on the step path:
the engine core already sends the snapshot with every message."""

from __future__ import annotations

from itertools import accumulate

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from scheduler_svc.engine.stats import STEP_TIME_BUCKETS

P = "llmserve:"


class EngineCollector:
    """vLLM-named figures (llmserve: prefix, model_name label) and the older unlabelled
    llmserve_* ones, kept for existing scrapers."""

    def __init__(self, engine, model_name: str):
        self._engine = engine
        self._model = [model_name]

    def describe(self):
        return []  # collected at scrape time only

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(P + name, doc, labels=["model_name"])
        g.add_metric(self._model, value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(P + name, doc, labels=["model_name"])
        c.add_metric(self._model, value)
        return c

    def collect(self):
        s = self._engine.stats  # one snapshot from the engine core
        usage = 1 - s.num_free_blocks / s.num_total_blocks if s.num_total_blocks else 0.0
        yield self._gauge("num_requests_running", "Requests in the running batch", s.num_running)
        yield self._gauge("num_requests_waiting", "Requests waiting to be scheduled", s.num_waiting)
        yield self._gauge("kv_cache_usage_perc", "KV cache usage (fraction of blocks in use, 0..1)",
                          usage)
        yield self._counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                            s.prefix_cache_queries)
        yield self._counter("prefix_cache_hits", "Prompt tokens found in the prefix cache",
                            s.prefix_cache_hits)
        yield self._counter("num_preemptions", "Preemptions (a running request sent back to "
                            "the queue to be recomputed)", s.num_preemptions)
        yield self._counter("spec_decode_num_drafts", "Speculative decoding: verify rows (one "
                            "request's drafts checked in one step)", s.spec_decode_num_drafts)
        yield self._counter("spec_decode_num_draft_tokens", "Speculative decoding: draft tokens "
                            "proposed", s.spec_decode_num_draft_tokens)
        yield self._counter("spec_decode_num_accepted_tokens", "Speculative decoding: draft tokens "
                            "accepted", s.spec_decode_num_accepted_tokens)
        busy = (s.prepare_us + s.forward_us + s.sample_us) / 1e6
        yield self._counter("executor_busy_seconds", "Executor time in steps (prepare + forward "
                            "+ sample)", busy)
        steps = CounterMetricFamily(P + "executor_steps", "Executor steps, by CUDA graph replay "
                                    "(graph) or eager forward", labels=["model_name", "mode"])
        steps.add_metric(self._model + ["graph"], s.num_graph_steps)
        steps.add_metric(self._model + ["eager"], s.num_steps - s.num_graph_steps)
        yield steps
        yield self._step_time(s.step_time_counts, busy)
        yield from _legacy(s)

    def _step_time(self, counts: tuple, busy: float) -> HistogramMetricFamily:
        counts = counts or (0,) * (len(STEP_TIME_BUCKETS) + 1)
        cumulative = list(accumulate(counts))
        buckets = [(repr(float(le)), n) for le, n in zip(STEP_TIME_BUCKETS, cumulative)]
        buckets.append(("+Inf", cumulative[-1]))
        h = HistogramMetricFamily(P + "executor_step_time_seconds", "Executor time of one step "
                                  "(prepare + forward + sample)", labels=["model_name"])
        h.add_metric(self._model, buckets, sum_value=busy)
        return h


def _legacy(s):
    """The names of the first metrics release (unlabelled, llmserve_ prefix)."""
    yield GaugeMetricFamily("llmserve_kv_blocks_free", "Free KV blocks", value=s.num_free_blocks)
    yield GaugeMetricFamily("llmserve_kv_blocks_total", "Usable KV blocks", value=s.num_total_blocks)
    yield GaugeMetricFamily("llmserve_requests_running", "Running requests", value=s.num_running)
    yield GaugeMetricFamily("llmserve_requests_waiting", "Waiting requests", value=s.num_waiting)
    yield CounterMetricFamily("llmserve_steps", "Steps executed", value=s.num_steps)
    yield CounterMetricFamily("llmserve_graph_steps", "Steps replayed from a CUDA graph",
                              value=s.num_graph_steps)
    yield CounterMetricFamily("llmserve_executor_forward_seconds", "Executor forward time",
                              value=s.forward_us / 1e6)
    yield CounterMetricFamily("llmserve_prefix_cache_queries", "Prompt tokens looked up in the "
                              "prefix cache", value=s.prefix_cache_queries)
    yield CounterMetricFamily("llmserve_prefix_cache_hits", "Prompt tokens found in the prefix "
                              "cache (KV reused)", value=s.prefix_cache_hits)
    yield GaugeMetricFamily("llmserve_prefix_cache_hit_rate", "Prefix cache hits / queries since "
                            "start", value=s.prefix_cache_hits / max(s.prefix_cache_queries, 1))
