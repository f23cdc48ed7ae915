"""benchmarks/first_run.py's figures as the report reads them (no GPU: a written first.json)."""

from __future__ import annotations

import json

from benchmarks import first_run, report


def _w(w1_ms, w2, w3):
    return {"w1": {"tpot_ms": w1_ms, "tok_s": 1.0, "ttft_ms": 1.0}, "w2": {"tpot_ms": 1.0, "tok_s": w2, "ttft_ms": 1.0},
            "w3": {"tpot_ms": 1.0, "tok_s": w3, "ttft_ms": 1.0}}


def test_warm_is_the_median_and_the_report_says_first_over_warm(tmp_path):
    warm = first_run._median_of([_w(1.0, 40_000, 26_000), _w(1.2, 42_000, 60_000), _w(1.1, 41_000, 41_000)])
    assert warm == _w(1.1, 41_000, 41_000)
    start = {"start_s": 40.0, "capture_s": 22.1, "compiled": 71, "from_disk": 0, "compiled_while_serving": 0}
    rows = {"fresh": {**start, "first": _w(2.2, 20_500, 41_000), "warm": warm},
            "restart": {**start, "capture_s": 1.8, "from_disk": 71, "first": _w(1.1, 41_000, 36_900)}}
    (tmp_path / "first.json").write_text(json.dumps(rows))
    table = {what: (figure, comparison) for what, figure, comparison in report.rows(tmp_path)}
    assert table["first run after a fresh start / warm"][0] == "W1 0.50x"
    assert table["first run after a fresh start / warm"][1].startswith("W2 0.50x, W3 1.00x")
    assert table["first run after a restart start / warm"][1].startswith("W2 1.00x, W3 0.90x")
    assert "capture 1.8 s; Triton compiled 71 (71 from disk)" in table["start-up, restart cache: serving after"][1]
