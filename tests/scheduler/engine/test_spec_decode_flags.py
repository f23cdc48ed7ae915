"""--speculative-config: parsed at start, off by default, reaching the core; its figures in the
metrics and the stats line."""

import pytest

from llmserve.speculative import SpecDecodeConfig
from scheduler_svc.config import from_args
from scheduler_svc.engine.core_process import core_config
from scheduler_svc.engine.stats import EngineStats, StatsLogger
from scheduler_svc.messages import CoreStats
from tests.scheduler.api.test_metrics import _bound, _samples
from tests.scheduler.engine.test_core_config import INFO

TEXT = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'


def test_speculation_is_off_by_default_and_the_flag_reaches_the_core(monkeypatch):
    assert from_args([]).speculative_config == "" and core_config(from_args([]), INFO).speculative is None
    spec = core_config(from_args(["--speculative-config", TEXT]), INFO).speculative
    assert spec == SpecDecodeConfig("ngram", 4, 4, 2)
    monkeypatch.setenv("LLMSERVE_SCHEDULER_SPECULATIVE_CONFIG", '{"num_speculative_tokens": 2}')
    assert core_config(from_args([]), INFO).speculative == SpecDecodeConfig("ngram", 2, 5, 5)


@pytest.mark.parametrize("bad", ['{"method": "eagle", "num_speculative_tokens": 2}', "{",
                                 '{"num_speculative_tokens": -1}'])
def test_bad_speculative_configs_stop_at_parse_time(bad, capsys):
    with pytest.raises(SystemExit):
        from_args(["--speculative-config", bad])
    assert "--speculative-config" in capsys.readouterr().err


def test_spec_decode_counters_and_stats_line():
    stats = CoreStats(num_total_blocks=10, num_free_blocks=4, spec_decode_num_drafts=4,
                      spec_decode_num_draft_tokens=16, spec_decode_num_accepted_tokens=6)
    s = _samples(_bound(stats))
    one = frozenset([("model_name", "tiny")])
    assert s[("llmserve:spec_decode_num_drafts_total", one)] == 4
    assert s[("llmserve:spec_decode_num_draft_tokens_total", one)] == 16
    assert s[("llmserve:spec_decode_num_accepted_tokens_total", one)] == 6
    fresh = CoreStats(num_total_blocks=10, num_free_blocks=10)
    logger = StatsLogger(EngineStats(fresh), interval=10)
    fresh.num_steps, fresh.spec_decode_num_drafts = 3, 4
    fresh.spec_decode_num_draft_tokens, fresh.spec_decode_num_accepted_tokens = 16, 6
    assert logger.line().endswith("Spec decode: mean acceptance length 2.50, draft acceptance rate 37.5%")
    fresh.num_steps = 4
    assert "Spec decode" not in logger.line()  # nothing proposed meanwhile
