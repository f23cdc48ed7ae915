"""A histogram observed a batch at a time and exposed under one or more names.

The inter-token gaps are the one per-token metric: hundreds of outputs a step at high
concurrency, each observed twice (vLLM's `inter_token_latency_seconds` and its older name
`time_per_output_token_seconds`, the same observations). prometheus_client's Histogram takes
one value per call (a lock and a bucket search each, ~1-2 µs): about a millisecond of the API
process's event loop per 256-row step. BatchHistogram takes a step's gaps in one call (numpy
bucket search) and exposes the same bucket counts under every name it was given, as
prometheus_client would (`_bucket` cumulative with `le`, `_count`, `_sum`).
"""

from __future__ import annotations

import threading

import numpy as np
from prometheus_client.metrics_core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString


class BatchHistogram(Collector):
    """Buckets (upper bounds, +Inf added) and their counts; names: (name, documentation)
    pairs, each exposed with the label model_name."""

    def __init__(self, names: list[tuple[str, str]], buckets: tuple[float, ...], model_name: str):
        self._names, self._model = names, model_name
        self._bounds = np.array([*buckets, float("inf")])
        self._counts = np.zeros(len(self._bounds), dtype=np.int64)
        self._sum = 0.0
        self._lock = threading.Lock()  # (a scrape may run on prometheus_client's server thread)

    def observe_many(self, values: list[float]) -> None:
        """Counts each value in the first bucket whose bound is >= it."""
        if not values:
            return
        v = np.asarray(values, dtype=np.float64)
        counts = np.bincount(np.searchsorted(self._bounds, v, side="left"), minlength=len(self._bounds))
        with self._lock:
            self._counts += counts
            self._sum += float(v.sum())

    def collect(self):
        with self._lock:
            cumulative, total = np.cumsum(self._counts).tolist(), self._sum
        buckets = [(floatToGoString(b), c) for b, c in zip(self._bounds.tolist(), cumulative)]
        for name, doc in self._names:
            family = HistogramMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([self._model], buckets, total)
            yield family
