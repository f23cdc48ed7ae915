"""GET /metrics of the HTTP API: Prometheus text of the scheduler's metrics.

scheduler_svc.api.metrics owns them: its process-wide object renders its registry
(`render() -> bytes`); without one, prometheus_client's default registry is served."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

CONTENT_TYPE = CONTENT_TYPE_LATEST


def metrics_text(source=None) -> bytes:
    render = getattr(source, "render", None)
    if callable(render):
        return render()
    return generate_latest(REGISTRY)
