"""Prometheus metrics for the scheduler, served on their own HTTP port (prometheus_client)."""

from __future__ import annotations

from prometheus_client import REGISTRY, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class _EngineCollector:
    """Reads live figures from the engine at scrape time (nothing on the step path)."""

    def __init__(self, engine):
        self._engine = engine

    def collect(self):
        s = stats = self._engine.stats  # one snapshot from the engine core
        yield GaugeMetricFamily("llmserve_kv_blocks_free", "Free KV blocks", value=s.num_free_blocks)
        yield GaugeMetricFamily("llmserve_kv_blocks_total", "Usable KV blocks", value=s.num_total_blocks)
        yield GaugeMetricFamily("llmserve_requests_running", "Running requests", value=s.num_running)
        yield GaugeMetricFamily("llmserve_requests_waiting", "Waiting requests", value=s.num_waiting)
        yield CounterMetricFamily("llmserve_steps", "Steps executed", value=stats.num_steps)
        yield CounterMetricFamily("llmserve_graph_steps", "Steps replayed from a CUDA graph",
                                  value=stats.num_graph_steps)
        yield CounterMetricFamily("llmserve_executor_forward_seconds", "Executor forward time",
                                  value=stats.forward_us / 1e6)
        yield CounterMetricFamily("llmserve_prefix_cache_queries", "Prompt tokens looked up in the "
                                  "prefix cache", value=s.prefix_cache_queries)
        yield CounterMetricFamily("llmserve_prefix_cache_hits", "Prompt tokens found in the prefix "
                                  "cache (KV reused)", value=s.prefix_cache_hits)
        yield GaugeMetricFamily("llmserve_prefix_cache_hit_rate", "Prefix cache hits / queries since "
                                "start", value=s.prefix_cache_hits / max(s.prefix_cache_queries, 1))


def start_metrics(port: int, engine) -> None:
    REGISTRY.register(_EngineCollector(engine))
    start_http_server(port)
