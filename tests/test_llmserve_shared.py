"""What the launcher and both services read alike (llmserve/): one --speculative-config parser,
one env fallback, one log format, one definition of the limits both sides size for."""

import argparse

import pytest

from executor_svc.config import ExecutorConfig
from llmserve import limits
from llmserve.env import env_default, env_name
from llmserve.logs import log_format
from llmserve.speculative import draft_model_of, executor_flag, names_draft_model, parse_speculative_config
from scheduler_svc.api.validation import Limits, SizeLimits
from scheduler_svc.config import SchedulerConfig, from_args
from step_protocol.domain import ExecutorInfo

CONFIGS = ['{"method": "ngram", "num_speculative_tokens": 4}', '{"model": "/d", "num_speculative_tokens": 2}',
           '{"method": "draft_model", "model": "/d", "num_speculative_tokens": 3, "disable_by_batch_size": 8}',
           '{"num_speculative_tokens": 2, "prompt_lookup_min": 3}', ""]
BAD = ['{"method": "eagle", "num_speculative_tokens": 2}', '{"model": "/d"}', "[1]", "{",
       '{"num_speculative_tokens": 2, "unknown": 1}', '{"model": "/d", "num_speculative_tokens": 2, "prompt_lookup_min": 2}']


@pytest.mark.parametrize("text", CONFIGS)
def test_the_three_readers_agree_on_a_config(text):
    config = parse_speculative_config(text)
    draft = config is not None and config.method == "draft_model"
    assert names_draft_model(text) is draft
    assert draft_model_of(text) == ((config.model, config.num_speculative_tokens) if draft else ("", 0))
    assert from_args(["--speculative-config", text]).speculative_config == text
    executor = ExecutorConfig.from_args(["--device", "cpu", "--speculative-config", text])
    assert (executor.speculative_model, executor.num_speculative_tokens) == draft_model_of(text)


@pytest.mark.parametrize("text", BAD)
def test_both_services_refuse_the_same_configs(text):
    with pytest.raises(ValueError):
        parse_speculative_config(text)
    with pytest.raises(argparse.ArgumentTypeError):
        executor_flag(text)
    for start in (lambda: from_args(["--speculative-config", text]),
                  lambda: ExecutorConfig.from_args(["--device", "cpu", "--speculative-config", text])):
        with pytest.raises(SystemExit):
            start()


def test_env_default_takes_the_type_of_the_default():
    env = {"P_MAX_NUM_SEQS": "12", "P_ON": "Yes", "P_OFF": "0", "P_RATE": "0.5", "P_NAME": "x"}
    assert env_name("P_", "max-num-seqs") == "P_MAX_NUM_SEQS"
    assert env_default("P_", "max-num-seqs", 0, env) == 12
    assert (env_default("P_", "on", False, env), env_default("P_", "off", True, env)) == (True, False)
    assert (env_default("P_", "rate", 1.0, env), env_default("P_", "name", "", env)) == (0.5, "x")
    assert env_default("P_", "absent", 7, env) == 7


def test_env_fallbacks_of_both_services(monkeypatch):
    monkeypatch.setenv("LLMSERVE_SCHEDULER_MAX_STOP_TOKEN_IDS", "9")
    monkeypatch.setenv("LLMSERVE_EXECUTOR_ENFORCE_EAGER", "on")
    monkeypatch.setenv("LLMSERVE_EXECUTOR_MAX_NUM_SEQS", "5")
    assert from_args([]).max_stop_token_ids == 9
    executor = ExecutorConfig.from_args(["--device", "cpu"])
    assert executor.enforce_eager and executor.max_num_seqs == 5


def test_one_log_format():
    assert log_format("scheduler").endswith("] %(levelname)s %(name)s: %(message)s")
    assert " executor[" in log_format("executor", "rank 1") and "] rank 1 %(levelname)s" in log_format("executor", "rank 1")


def test_one_definition_of_the_limits():
    assert limits.MAX_MIN_TOKENS_STOP_IDS == limits.MAX_STOP_TOKEN_IDS + limits.MAX_EOS_TOKEN_IDS == 288
    assert SchedulerConfig().max_stop_token_ids == SizeLimits().max_stop_token_ids == limits.MAX_STOP_TOKEN_IDS
    assert ExecutorConfig().max_logprobs == Limits(1, 1, 1, 1).max_logprobs == limits.MAX_LOGPROBS
    info = ExecutorInfo("m", "/m", 8, (), 16, 16, 4, (), 1, 16, "cpu", "float32")
    assert (info.max_logit_bias, info.max_min_tokens_stop_ids) == (limits.MAX_LOGIT_BIAS, limits.MAX_MIN_TOKENS_STOP_IDS)
