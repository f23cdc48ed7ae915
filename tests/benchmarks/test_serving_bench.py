"""The serving benchmark (benchmarks/serving.py): its seeded workload and arrivals, its
statistics on hand-made records, and one run through both real services on the CPU."""

import math

import numpy as np
import pytest

from benchmarks.serving import (
    OUTPUT_LENGTHS,
    PROMPT_LENGTHS,
    LengthDist,
    arrival_times,
    make_requests,
    run_serving,
)
from benchmarks.serving_stats import RequestRecord, summarize, table_lines
from tests.integration.conftest import llama_cluster, model_dirs  # noqa: F401 (fixtures)


def test_arrival_times_are_seeded_and_poisson():
    a = arrival_times(20000, 50.0, seed=3)
    assert np.array_equal(a, arrival_times(20000, 50.0, seed=3))
    assert not np.array_equal(a, arrival_times(20000, 50.0, seed=4))
    assert a[0] == 0 and np.all(np.diff(a) >= 0) and len(a) == 20000
    assert np.diff(a).mean() == pytest.approx(1 / 50.0, rel=0.03)  # ~20,000 gaps: 0.7% std error
    assert np.diff(a).std() == pytest.approx(1 / 50.0, rel=0.05)  # exponential: std = mean


def test_infinite_rate_is_a_burst_and_bad_rates_are_refused():
    assert np.array_equal(arrival_times(7, math.inf, seed=0), np.zeros(7))
    for rate in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError):
            arrival_times(3, rate, seed=0)


def test_requests_are_seeded_clipped_and_in_vocab():
    reqs = make_requests(2000, 1000, seed=5)
    assert reqs == make_requests(2000, 1000, seed=5)
    assert reqs != make_requests(2000, 1000, seed=6)
    prompt_lens = np.array([len(p) for p, _ in reqs])
    output_lens = np.array([m for _, m in reqs])
    assert prompt_lens.min() >= PROMPT_LENGTHS.lo and prompt_lens.max() <= PROMPT_LENGTHS.hi
    assert output_lens.min() >= OUTPUT_LENGTHS.lo and output_lens.max() <= OUTPUT_LENGTHS.hi
    assert np.median(prompt_lens) == pytest.approx(256, rel=0.1)
    assert np.median(output_lens) == pytest.approx(128, rel=0.1)
    ids = np.concatenate([p for p, _ in reqs])
    assert ids.min() >= 100 and ids.max() < 1000


def test_variant_changes_ids_not_lengths():
    a, b = make_requests(50, 1000, seed=1), make_requests(50, 1000, seed=1, variant=1)
    assert [(len(p), m) for p, m in a] == [(len(p), m) for p, m in b]
    assert all(pa != pb for (pa, _), (pb, _) in zip(a, b))


def test_length_overrides():
    reqs = make_requests(100, 512, seed=0, prompt=LengthDist(16, 0.5, 4, 32), output=LengthDist(6, 0.3, 2, 8))
    assert all(4 <= len(p) <= 32 and 2 <= m <= 8 for p, m in reqs)


def _record(ttft_ms: float, tpot_ms: float, tokens: int = 11) -> RequestRecord:
    """A completed request with the given TTFT and TPOT, one token per message."""
    gap = tpot_ms / 1e3
    return RequestRecord(prompt_tokens=100, max_tokens=tokens, output_tokens=tokens,
                         ttft_s=ttft_ms / 1e3, e2e_s=ttft_ms / 1e3 + gap * (tokens - 1),
                         itl_s=[gap] * (tokens - 1))


def test_summary_percentiles_goodput_and_failures():
    # TTFT 100, 200, ..., 1000 ms; TPOT 10, 20, ..., 100 ms: requests 1-5 meet TTFT <= 500 and
    # requests 1-5 TPOT <= 50 (bounds included), so exactly 5 meet both; TPOT <= 35 leaves 3.
    records = [_record(100 * i, 10 * i) for i in range(1, 11)]
    records.append(RequestRecord(prompt_tokens=7, max_tokens=11, error="UNAVAILABLE: gone"))
    row = summarize(records, duration_s=2.0, slo_ttft_ms=500, slo_tpot_ms=50)
    assert (row["num_requests"], row["completed"], row["failed"]) == (11, 10, 1)
    assert row["errors"] == {"UNAVAILABLE: gone": 1}
    assert row["output_tokens"] == 110 and row["prompt_tokens"] == 1000
    assert row["request_throughput"] == 5.0 and row["output_throughput"] == 55.0
    assert row["total_token_throughput"] == 555.0
    # numpy's linear interpolation over 10 values: p50 = 5.5th, p90 = 9.1th, p99 = 9.91th
    assert row["ttft_mean_ms"] == pytest.approx(550)
    assert (row["ttft_p50_ms"], row["ttft_p90_ms"], row["ttft_p99_ms"]) == pytest.approx((550, 910, 991))
    assert (row["tpot_p50_ms"], row["tpot_p90_ms"], row["tpot_p99_ms"]) == pytest.approx((55, 91, 99.1))
    assert row["itl_mean_ms"] == pytest.approx(55) and row["itl_p50_ms"] == pytest.approx(55)
    assert row["e2e_p50_ms"] == pytest.approx(1100)  # e2e_i = 100 i + 10 * 10 i = 200 i ms
    assert row["goodput"] == 2.5 and row["goodput_share"] == pytest.approx(5 / 11)
    assert summarize(records, 2.0, 500, 35)["goodput"] == 1.5
    assert len(table_lines([{"rate": 4.0, **row}])) == 3


def test_multi_token_messages_are_one_gap_and_single_tokens_have_no_tpot():
    chunked = RequestRecord(prompt_tokens=4, max_tokens=9, output_tokens=9, ttft_s=0.1, e2e_s=0.3,
                            itl_s=[0.1, 0.1])  # three messages of 3 tokens each
    single = RequestRecord(prompt_tokens=4, max_tokens=1, output_tokens=1, ttft_s=0.2, e2e_s=0.2)
    row = summarize([chunked, single], duration_s=1.0, slo_ttft_ms=500, slo_tpot_ms=20)
    assert row["itl_mean_ms"] == pytest.approx(100)
    assert row["tpot_mean_ms"] == pytest.approx(25) and single.tpot_s is None
    assert row["goodput"] == 1.0  # the single-token request meets the TPOT SLO vacuously


def test_all_failed_rate_has_no_latencies():
    row = summarize([RequestRecord(3, 5, error="x")], 1.0, 500, 50)
    assert row["completed"] == 0 and row["ttft_p50_ms"] is None and row["goodput"] == 0.0
    assert "-/-/-/-" in table_lines([{"rate": math.inf, **row}])[2]


def test_run_serving_through_both_services(llama_cluster):  # noqa: F811
    prompt, output = LengthDist(16, 0.5, 4, 32), LengthDist(6, 0.3, 2, 8)
    rows = run_serving(llama_cluster.address, 512, [20.0, math.inf], 8, seed=0,
                       prompt=prompt, output=output, slo_ttft_ms=10_000, slo_tpot_ms=10_000)
    expected = make_requests(8, 512, 0, prompt, output)
    assert [r["rate"] for r in rows] == [20.0, math.inf]
    for row in rows:
        assert (row["completed"], row["failed"], row["errors"]) == (8, 0, {}), row
        assert row["output_tokens"] == sum(m for _, m in expected)
        assert row["prompt_tokens"] == sum(len(p) for p, _ in expected)
        for name in ("ttft", "tpot", "itl", "e2e"):
            p50, p90, p99 = (row[f"{name}_p{p}_ms"] for p in (50, 90, 99))
            assert 0 <= p50 <= p90 <= p99, (name, row)
        for stat in ("mean", "p50", "p90", "p99"):
            assert row[f"ttft_{stat}_ms"] <= row[f"e2e_{stat}_ms"]
        assert row["goodput"] <= row["request_throughput"] and row["goodput_share"] == 1.0
    assert rows[0]["duration_s"] >= arrival_times(8, 20.0, seed=0)[-1]  # the last one waited its turn
