"""Prefix caching through both services: hits reported by GetServerStatus and the metrics, and
greedy outputs identical to a cluster started with --no-enable-prefix-caching."""

import concurrent.futures as cf
import urllib.request

from benchmarks.cluster import free_port, generate
from tests.integration.conftest import start_cluster

SHARED = [(7 * i) % 400 + 3 for i in range(40)]  # 40 tokens: 2 full blocks of 16
PROMPTS = [SHARED + [11, 12, 13, 14, 15], SHARED + [21, 22, 23]]  # 45 and 43 tokens


def _serve(cluster) -> list[list[int]]:
    """The two prompts one after the other (the second arrives once the first is done)."""
    return [generate(cluster.stub, prompt_ids=p, max_tokens=12, temperature=0.0)[0] for p in PROMPTS]


def _start_both(tmp_path_factory, model, metrics_port):
    """The same model with and without prefix caching, started at once."""
    configs = [("prefix-on", ["--metrics-port", str(metrics_port)]),
               ("prefix-off", ["--no-enable-prefix-caching"])]
    with cf.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(start_cluster, tmp_path_factory, model, name, (), args)
                   for name, args in configs]
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        for f in futures:
            if f.exception() is None:
                f.result().stop()
        raise errors[0]
    return [f.result() for f in futures]


def test_shared_prefix_hits_and_outputs_match_without_caching(model_dirs, tmp_path_factory):
    metrics_port = free_port()
    on, off = _start_both(tmp_path_factory, model_dirs["llama"], metrics_port)
    try:
        with cf.ThreadPoolExecutor(2) as pool:
            got_on, got_off = pool.map(_serve, [on, off])
        assert got_on == got_off
        s = on.wait_idle()
        assert (s.prefix_cache_queries, s.prefix_cache_hits) == (45 + 43, 32)  # the 2nd hit 2 blocks
        assert abs(s.prefix_cache_hit_rate - 32 / 88) < 1e-9
        assert s.free_blocks == s.total_blocks  # cached blocks count as free
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        assert "llmserve_prefix_cache_queries_total 88.0" in metrics
        assert "llmserve_prefix_cache_hits_total 32.0" in metrics
        s = off.wait_idle()
        assert (s.prefix_cache_queries, s.prefix_cache_hits, s.prefix_cache_hit_rate) == (0, 0, 0.0)
    finally:
        on.stop()
        off.stop()
