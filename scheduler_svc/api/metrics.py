"""Prometheus metrics of the scheduler, with vLLM's names and meanings under an `llmserve:`
prefix and a model_name label (docs/metrics.md lists them; deploy/grafana has a dashboard).

One Metrics object per API process (server.py makes it), with its own CollectorRegistry: the
request metrics are observed here as the engine client sees each request's events (arrival,
first scheduled, each output, finish: a few additions and dictionary look-ups per output, the
inter-token gaps of a message in one batch, metrics_hist.py); the
load and executor figures are read at scrape time from the engine core's snapshot
(metrics_engine.py). render() gives the exposition text for any HTTP server; serve() starts
prometheus_client's own server for --metrics-port. The per-request log line is access_log.py's.
"""

from __future__ import annotations

import logging

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram,
                               generate_latest, start_http_server)

from scheduler_svc.api.metrics_engine import EngineCollector
from scheduler_svc.api.metrics_hist import BatchHistogram
from scheduler_svc.core.outputs import RequestOutput
from scheduler_svc.core.request import FinishReason

_serve_log = logging.getLogger("llmserve.metrics")
metrics_content_type = CONTENT_TYPE_LATEST  # the Content-Type of render()'s bytes
P = "llmserve:"

# vLLM's bucket boundaries (seconds).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
# vLLM's finished_reason values: our EOS and stop strings / stop token ids are both "stop".
FINISHED_REASON = {FinishReason.EOS: "stop", FinishReason.STOP: "stop",
                   FinishReason.LENGTH: "length", FinishReason.CANCELLED: "abort"}
ABORT, ERROR = "abort", "error"  # the client went away or read too slowly; the server failed it


def token_buckets(max_model_len: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_model_len (vLLM's token-count buckets)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_model_len:
                return out
            out.append(m * scale)
        scale *= 10


class _Req:
    """One request's (sample's) timestamps (time.monotonic) and token counts."""

    __slots__ = ("arrival", "scheduled", "first", "last", "num_prompt", "num_gen")

    def __init__(self, arrival: float, num_prompt: int):
        self.arrival = arrival
        self.scheduled = self.first = self.last = None
        self.num_prompt = num_prompt
        self.num_gen = 0


class Metrics:
    """The API process's metrics: bind() once the executor is known, then the engine client's
    hooks (arrived, scheduled, output, ended) feed it."""

    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=False)
        self._requests: dict[int, _Req] = {}
        self._bound = False

    def bind(self, engine, model_name: str, max_model_len: int) -> None:
        """Creates the metrics (their token buckets follow max_model_len) and registers the
        scrape-time collector of the engine's snapshot."""
        r, labels = self.registry, ["model_name"]

        def hist(name, doc, buckets):
            return Histogram(P + name, doc, labels, registry=r, buckets=buckets).labels(model_name)

        def counter(name, doc):
            return Counter(P + name, doc, labels, registry=r).labels(model_name)

        self.prompt_tokens = counter("prompt_tokens", "Prefill tokens processed")
        self.generation_tokens = counter("generation_tokens", "Generation tokens processed")
        success = Counter(P + "request_success", "Finished requests, by finish reason",
                          ["model_name", "finished_reason"], registry=r)
        self.success = {k: success.labels(model_name, k) for k in ("stop", "length", ABORT, ERROR)}
        self.ttft = hist("time_to_first_token_seconds", "Time to first token", TTFT_BUCKETS)
        self.gaps = BatchHistogram([  # (one per output after the first: metrics_hist.py)
            (P + "inter_token_latency_seconds", "Time between consecutive outputs"),
            (P + "time_per_output_token_seconds", "Time per output token (the same observations as "
                                                  "inter_token_latency_seconds; vLLM's older name)")],
            ITL_BUCKETS, model_name)
        r.register(self.gaps)
        self.e2e = hist("e2e_request_latency_seconds", "End-to-end request latency",
                        REQUEST_LATENCY_BUCKETS)
        self.queue = hist("request_queue_time_seconds", "Time from arrival to first scheduled",
                          REQUEST_LATENCY_BUCKETS)
        self.prefill = hist("request_prefill_time_seconds", "Time from first scheduled to first "
                            "token", REQUEST_LATENCY_BUCKETS)
        self.decode = hist("request_decode_time_seconds", "Time from first token to last token",
                           REQUEST_LATENCY_BUCKETS)
        self.inference = hist("request_inference_time_seconds", "Time from first scheduled to "
                              "last token", REQUEST_LATENCY_BUCKETS)
        self.request_tpot = hist("request_time_per_output_token_seconds", "Decode time per "
                                 "output token after the first, per request", ITL_BUCKETS)
        tokens = token_buckets(max_model_len)
        self.request_prompt = hist("request_prompt_tokens", "Prompt tokens per request", tokens)
        self.request_generation = hist("request_generation_tokens", "Generation tokens per request",
                                       tokens)
        r.register(EngineCollector(engine, model_name))
        self._bound = True

    # -- exposition ----------------------------------------------------------------------

    def render(self) -> bytes:
        """The registry in Prometheus text format (Content-Type: metrics_content_type)."""
        return generate_latest(self.registry)

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        """Serves render()'s text at http://host:port/metrics (a daemon thread, not the loop)."""
        start_http_server(port, addr=host, registry=self.registry)
        _serve_log.info("serving Prometheus metrics on http://%s:%d/metrics", host, port)

    # -- the engine client's hooks -------------------------------------------------------

    def arrived(self, req_ids: range, num_prompt_tokens: int, now: float) -> None:
        if self._bound:
            for i in req_ids:
                self._requests[i] = _Req(now, num_prompt_tokens)

    def scheduled(self, req_id: int, when: float) -> None:
        r = self._requests.get(req_id)
        if r is not None and r.scheduled is None:  # a resumed preempted request: keep the first
            r.scheduled = when

    def output(self, o: RequestOutput, now: float) -> None:
        self.outputs((o,), now)

    def outputs(self, outs, now: float) -> None:
        """One message's outputs (all seen at `now`): the generated-token counter is added to
        once per message, the latency histograms observe each output as output() would."""
        if not self._bound:
            return  # (nothing arrived: no request is known)
        requests, num_generated, gaps = self._requests, 0, []
        for o in outs:
            r = requests.get(o.req_id)
            if r is None:
                continue
            n = len(o.new_token_ids)
            if n:
                if r.first is None:
                    r.first = now
                    self.ttft.observe(now - r.arrival)
                    self.prompt_tokens.inc(r.num_prompt)
                else:
                    gaps.append(now - r.last)
                r.last = now
                r.num_gen += n
                num_generated += n
            if o.finish_reason is not None:
                self._finish(o.req_id, FINISHED_REASON[o.finish_reason], now)
        if num_generated:
            self.generation_tokens.inc(num_generated)
            self.gaps.observe_many(gaps)

    def ended(self, req_id: int, failed: bool, now: float) -> None:
        """A request that ended without a finishing output (cancelled, aborted, failed)."""
        if req_id in self._requests:
            self._finish(req_id, ERROR if failed else ABORT, now)

    def _finish(self, req_id: int, reason: str, now: float) -> None:
        r = self._requests.pop(req_id)
        self.success[reason].inc()
        self.e2e.observe(now - r.arrival)
        self.request_prompt.observe(r.num_prompt)
        self.request_generation.observe(r.num_gen)
        if r.scheduled is not None:
            self.queue.observe(max(r.scheduled - r.arrival, 0.0))
            if r.first is not None:
                self.prefill.observe(max(r.first - r.scheduled, 0.0))
                self.inference.observe(max(r.last - r.scheduled, 0.0))
        if r.first is not None:
            self.decode.observe(r.last - r.first)
            if r.num_gen > 1:
                self.request_tpot.observe((r.last - r.first) / (r.num_gen - 1))
