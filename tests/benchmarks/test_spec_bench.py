"""The speculative decoding benchmark (benchmarks/spec_bench.py) through both real services on
the CPU, on a tiny random model: a short passage, 48 tokens (its greedy output falls into
loops, which the lookup drafts from), a small batch. The output dict has the figures of both
modes and batches, the greedy outputs agree with and without speculation, and the report rows
are built from it."""

import json

from benchmarks import spec_bench
from tests.integration.conftest import model_dirs  # noqa: F401 (fixture)

FIGURES = {"batch", "prompt_tokens", "tokens", "wall_s", "tok_s", "tpot_ms", "ttft_ms", "steps",
           "num_drafts", "num_draft_tokens", "num_accepted_tokens", "acceptance_rate", "acceptance_length", "per_step"}


def test_spec_bench_runs_on_cpu(model_dirs, tmp_path):  # noqa: F811
    out: dict = {}
    passage = "one two three four five six seven. one two three four five six seven. one two"
    spec_bench.run(out, tmp_path, model_dirs["llama"], "cpu", passage=passage, max_tokens=48, batches=(1, 3))
    json.dumps(out)  # run_all writes it as JSON
    assert out["config"]["num_speculative_tokens"] == 4
    for mode in ("off", "on"):
        assert set(out[mode]) == {"b1", "b3"}
        for key, batch in (("b1", 1), ("b3", 3)):
            f = out[mode][key]
            assert set(f) == FIGURES and f["batch"] == batch and f["tokens"] == 48 * batch
            assert f["prompt_tokens"] > 20 and f["tpot_ms"] > 0 and f["steps"] > 0
    for key in ("b1", "b3"):
        assert out["off"][key]["num_draft_tokens"] == 0
        assert out["outputs"][key] == dict(equal=True, mismatched_requests=0, first_mismatch_position=None)
        assert out["tpot_speedup"][key] > 0 and out["tok_s_ratio"][key] > 0
    on = out["on"]["b1"]
    assert on["num_draft_tokens"] > 0, "the repeated passage in the prompt gave no drafts"
    assert on["acceptance_length"] == 1 + on["num_accepted_tokens"] / on["num_drafts"]
    assert isinstance(out["sample_text"], str)
    rows = spec_bench.rows(out)
    assert len(rows) == 4 and all(len(r) == 3 for r in rows)
    assert "greedy outputs equal" in rows[0][2]


def test_compare_reports_mismatches():
    assert spec_bench._compare([[1, 2], [3, 4]], [[1, 2], [3, 5]]) == dict(
        equal=False, mismatched_requests=1, first_mismatch_position=1)
    assert spec_bench.rows({}) == []


def test_spec_bench_draft_model_mode_on_cpu(model_dirs, tmp_path):  # noqa: F811
    """The draft-model mode: the target's own folder as its draft, so every draft is accepted;
    the report labels its rows apart from the n-gram ones."""
    out: dict = {}
    passage = "one two three four five six seven."
    folder = model_dirs["llama"]
    spec_bench.run(out, tmp_path, folder, "cpu", passage=passage, max_tokens=24, batches=(1, 2), draft=folder)
    json.dumps(out)
    assert out["config"]["method"] == "draft_model" and out["config"]["draft"] == str(folder)
    for key in ("b1", "b2"):
        on = out["on"][key]
        assert set(on) == FIGURES and on["tokens"] == 24 * on["batch"]
        assert on["num_draft_tokens"] > 0 and on["num_accepted_tokens"] == on["num_draft_tokens"]
        assert on["acceptance_rate"] == 1.0 and on["steps"] < out["off"][key]["steps"]
        assert out["outputs"][key]["equal"]
    rows = spec_bench.rows({"draft_model": out})
    assert len(rows) == 4 and rows[0][0] == "Spec draft-model (SmolLM2-135M shape -> llama-1b shape, random) b=1 TPOT on / off"
    assert "rate 100%" in rows[0][2] and "greedy outputs equal" in rows[0][2]
