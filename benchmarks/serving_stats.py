"""What the serving benchmark (benchmarks/serving.py) measures, from per-request records.

Kept apart from the client so the arithmetic is tested on hand-made records, without a server.
Definitions (all at the client, times in ms in the summary; "message" means a streamed message
carrying at least one token):

- TTFT: from sending the request to its first streamed message.
- TPOT: (last message time - first message time) / (tokens - 1), per request; requests with a
  single token have none (they are left out of the TPOT figures and meet the TPOT SLO).
- ITL: the gap between two consecutive streamed messages of one request, pooled over all
  requests. A message carrying k tokens (--stream-interval k) is one gap, not k: the client
  sees the tokens together, so splitting the gap would invent arrival times it never saw.
- E2E: from sending the request to its last message.
- goodput: completed requests per second whose TTFT and TPOT both meet the SLO; its share is
  over all requests sent (a failed request never meets the SLO).

Percentiles are numpy's (linear interpolation). Failed requests (an RPC error, or a stream
whose token count is not max_tokens) are counted and their errors reported, never dropped.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

PERCENTILES = (50, 90, 99)


@dataclass
class RequestRecord:
    """One request as the client saw it; times in seconds."""

    prompt_tokens: int
    max_tokens: int
    output_tokens: int = 0
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot_s(self) -> float | None:
        """None for requests with fewer than two tokens (no inter-token time exists)."""
        if self.output_tokens < 2 or self.ttft_s is None or self.e2e_s is None:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


def distribution_ms(name: str, values_s: list[float]) -> dict:
    """{name_mean_ms, name_p50_ms, name_p90_ms, name_p99_ms}; None entries with no values."""
    keys = [f"{name}_mean_ms"] + [f"{name}_p{p}_ms" for p in PERCENTILES]
    if not values_s:
        return dict.fromkeys(keys)
    ms = 1e3 * np.asarray(values_s, dtype=np.float64)
    figures = [ms.mean(), *np.percentile(ms, PERCENTILES)]
    return {k: float(v) for k, v in zip(keys, figures)}


def meets_slo(record: RequestRecord, slo_ttft_ms: float, slo_tpot_ms: float) -> bool:
    """Completed, TTFT <= slo_ttft_ms and (when it has one) TPOT <= slo_tpot_ms."""
    if not record.ok:
        return False
    tpot = record.tpot_s
    return 1e3 * record.ttft_s <= slo_ttft_ms and (tpot is None or 1e3 * tpot <= slo_tpot_ms)


def summarize(records: list[RequestRecord], duration_s: float, slo_ttft_ms: float,
              slo_tpot_ms: float) -> dict:
    """One rate's figures: counts, throughputs, latency distributions, goodput, errors."""
    done = [r for r in records if r.ok]
    output = sum(r.output_tokens for r in done)
    prompt = sum(r.prompt_tokens for r in done)
    good = sum(meets_slo(r, slo_ttft_ms, slo_tpot_ms) for r in records)
    row = dict(
        num_requests=len(records), completed=len(done), failed=len(records) - len(done),
        duration_s=duration_s, prompt_tokens=prompt, output_tokens=output,
        request_throughput=len(done) / duration_s, output_throughput=output / duration_s,
        total_token_throughput=(prompt + output) / duration_s,
    )
    row |= distribution_ms("ttft", [r.ttft_s for r in done])
    row |= distribution_ms("tpot", [r.tpot_s for r in done if r.tpot_s is not None])
    row |= distribution_ms("itl", [gap for r in done for gap in r.itl_s])
    row |= distribution_ms("e2e", [r.e2e_s for r in done])
    row |= dict(slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, goodput=good / duration_s,
                goodput_share=good / len(records) if records else 0.0,
                errors=dict(Counter(r.error for r in records if not r.ok).most_common(5)))
    return row


COLUMNS = ("rate", "done/sent", "dur s", "req/s", "out tok/s", "tot tok/s", "TTFT ms", "TPOT ms",
           "ITL ms", "E2E ms", "goodput req/s (share)")


def _quad(row: dict, name: str) -> str:
    values = [row[f"{name}_mean_ms"]] + [row[f"{name}_p{p}_ms"] for p in PERCENTILES]
    return "/".join("-" if v is None else f"{v:.1f}" for v in values)


def table_lines(rows: list[dict]) -> list[str]:
    """A caption, the header and one line per rate (rows as summarize returns them, plus
    "rate"); each latency cell is mean/p50/p90/p99."""
    cells = [COLUMNS] + [(
        f"{r['rate']:g}", f"{r['completed']}/{r['num_requests']}", f"{r['duration_s']:.1f}",
        f"{r['request_throughput']:.2f}", f"{r['output_throughput']:,.0f}",
        f"{r['total_token_throughput']:,.0f}", *(_quad(r, m) for m in ("ttft", "tpot", "itl", "e2e")),
        f"{r['goodput']:.2f} ({r['goodput_share']:.0%})") for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    caption = "latencies in ms: mean/p50/p90/p99"
    if rows:
        slo = rows[0]
        caption += f"; goodput SLO: TTFT <= {slo['slo_ttft_ms']:g} ms, TPOT <= {slo['slo_tpot_ms']:g} ms"
    return [caption] + ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in cells]
