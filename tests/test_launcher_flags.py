"""`llmserve`'s flags: the exact command line and environment each service gets, that each
service's own parser accepts them, that secrets stay out of every argv, and --help."""

import os
import re
import subprocess
import sys

import pytest

from executor_svc.config import ExecutorConfig
from llmserve.flags import (
    build_parser,
    commands,
    environments,
    parse_args,
    scheduler_has_http_api,
    security_hint,
)
from scheduler_svc.config import from_args as scheduler_from_args

PY = sys.executable
EXECUTOR = [PY, "-m", "executor_svc", "--host", "127.0.0.1", "--port", "50061"]
SCHEDULER = [PY, "-m", "scheduler_svc", "--host", "127.0.0.1", "--port", "50051",
             "--executor-address", "127.0.0.1:50061"]
EVERY_FLAG = ["--model", "/m/llama", "--served-model-name", "llama-1b", "--max-model-len", "4096",
              "--max-num-seqs", "4", "--max-num-batched-tokens", "1024", "--gpu-memory-utilization", "0.5",
              "--enforce-eager", "--dtype", "float16", "--block-size", "32", "--host", "0.0.0.0",
              "--port", "6000", "--executor-port", "6001", "--http-port", "8080", "--api-key", "sekrit-key",
              "--ssl-keyfile", "k.pem", "--ssl-certfile", "c.pem", "--ssl-ca-certs", "ca.pem",
              "--no-enable-prefix-caching", "--executor-args", "--device cpu --num-kv-blocks 64",
              "--scheduler-args", "--max-waiting 8"]


def test_defaults_pass_on_only_the_wiring_and_the_http_port():
    executor, scheduler = commands(parse_args([]), http_api=True)
    assert executor == EXECUTOR
    assert scheduler == [*SCHEDULER, "--http-port", "8000"]  # vLLM's port, on by default
    assert commands(parse_args(["--http-port", "0"]), http_api=True)[1] == [*SCHEDULER, "--http-port", "0"]


def test_a_scheduler_without_the_http_api_gets_no_http_flag(capsys):
    assert commands(parse_args([]), http_api=False) == (EXECUTOR, SCHEDULER)
    assert capsys.readouterr().err == ""  # the default asks nothing: no warning
    assert commands(parse_args(["--http-port", "9000"]), http_api=False)[1] == SCHEDULER
    assert "--http-port is ignored" in capsys.readouterr().err


def test_every_flag_goes_once_to_the_service_that_has_it():
    executor, scheduler = commands(parse_args(EVERY_FLAG), http_api=True)
    assert executor == [PY, "-m", "executor_svc", "--host", "127.0.0.1", "--port", "6001",
                        "--model", "/m/llama", "--model-name", "llama-1b", "--max-model-len", "4096",
                        "--max-num-seqs", "4", "--max-num-batched-tokens", "1024",
                        "--gpu-memory-utilization", "0.5", "--enforce-eager", "--dtype", "float16",
                        "--block-size", "32", "--device", "cpu", "--num-kv-blocks", "64"]
    # the limits reach the scheduler through the executor's handshake, so they are not repeated
    assert scheduler == [PY, "-m", "scheduler_svc", "--host", "0.0.0.0", "--port", "6000",
                         "--executor-address", "127.0.0.1:6001", "--http-port", "8080",
                         "--ssl-keyfile", "k.pem", "--ssl-certfile", "c.pem", "--ssl-ca-certs", "ca.pem",
                         "--no-enable-prefix-caching", "--max-waiting", "8"]
    assert "--enable-prefix-caching" in commands(parse_args(["--enable-prefix-caching"]), http_api=False)[1]


def test_secrets_go_through_the_environment_of_the_scheduler_only():
    args = parse_args(EVERY_FLAG)
    base = {"PATH": "/bin", "LLMSERVE_API_KEY": "old-key", "LLMSERVE_EXECUTOR_INTERNAL_TOKEN": "stale"}
    executor_env, scheduler_env = environments(args, base, "fresh-token")
    assert executor_env == {"PATH": "/bin", "LLMSERVE_INTERNAL_TOKEN": "fresh-token"}  # no API key
    assert scheduler_env == {**executor_env, "LLMSERVE_API_KEY": "old-key",
                             "LLMSERVE_SCHEDULER_API_KEY": "sekrit-key"}  # the flag wins
    argv = " ".join(arg for cmd in commands(args, http_api=True) for arg in cmd)
    assert "sekrit-key" not in argv and "fresh-token" not in argv and "--api-key" not in argv
    # without --api-key the scheduler keeps the key of the launcher's environment
    assert environments(parse_args([]), base, "t")[1]["LLMSERVE_API_KEY"] == "old-key"


def test_each_service_parses_what_it_is_given(monkeypatch):
    args = parse_args([*EVERY_FLAG, "--http-port", "0"])
    executor, scheduler = commands(args, http_api=scheduler_has_http_api())
    executor_env, scheduler_env = environments(args, {"PATH": os.environ.get("PATH", "")}, "tok")
    for name in [n for n in os.environ if n.startswith("LLMSERVE_")]:
        monkeypatch.delenv(name)
    for name, value in executor_env.items():
        monkeypatch.setenv(name, value)
    cfg = ExecutorConfig.from_args(executor[3:])
    assert (cfg.model, cfg.model_name, cfg.max_model_len, cfg.max_num_seqs, cfg.max_num_batched_tokens) == \
        ("/m/llama", "llama-1b", 4096, 4, 1024)
    assert (cfg.gpu_memory_utilization, cfg.enforce_eager, cfg.dtype, cfg.block_size, cfg.port) == \
        (0.5, True, "float16", 32, 6001)
    assert (cfg.internal_token, cfg.device, cfg.num_kv_blocks) == ("tok", "cpu", 64)
    for name, value in scheduler_env.items():
        monkeypatch.setenv(name, value)
    s = scheduler_from_args(scheduler[3:])
    assert (s.host, s.port, s.executor_address, s.api_key, s.internal_token) == \
        ("0.0.0.0", 6000, "127.0.0.1:6001", "sekrit-key", "tok")
    assert (s.ssl_keyfile, s.ssl_certfile, s.ssl_ca_certs, s.enable_prefix_caching, s.max_waiting) == \
        ("k.pem", "c.pem", "ca.pem", False, 8)
    if scheduler_has_http_api():
        assert s.http_port == 0


def test_flags_given_win_over_nothing_else():
    """A flag not given is not passed on, so LLMSERVE_EXECUTOR_<FLAG> still works under llmserve;
    one given with its default value is passed on (it wins over such a variable)."""
    executor, _ = commands(parse_args(["--block-size", "16", "--dtype", "auto"]), http_api=False)
    assert executor == [*EXECUTOR, "--dtype", "auto", "--block-size", "16"]


def test_security_hint_knows_the_new_flags():
    assert "LLMSERVE_API_KEY=<key>" in security_hint(parse_args([]), {})
    keyed = security_hint(parse_args(["--api-key", "k"]), {})
    assert "LLMSERVE_API_KEY" not in keyed and "--ssl-certfile cert.pem --ssl-keyfile key.pem" in keyed
    assert security_hint(parse_args(["--api-key", "k", "--ssl-certfile", "c", "--ssl-keyfile", "k"]), {}) == ""


def _help_entries(text: str) -> dict[str, str]:
    """Each option's entry of --help (the option strings, then its help), whitespace folded."""
    entries, current = {}, None
    for line in text.split("\n"):
        if re.match(r"^  -", line):
            current = line.strip().split()[0].rstrip(",")
            entries[current] = line
        elif current and line.startswith("   "):
            entries[current] += " " + line
        else:
            current = None
    return {k: " ".join(v.split()) for k, v in entries.items()}


def test_help_lists_every_flag_with_its_default():
    out = subprocess.run([PY, "-m", "llmserve", "--help"], check=False, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "COLUMNS": "100"})
    assert out.returncode == 0, out.stderr
    entries = _help_entries(out.stdout)
    actions = [a for a in build_parser()._actions if a.option_strings != ["-h", "--help"]]
    flags = [a.option_strings[0] for a in actions]
    for flag in ["--model", "--served-model-name", "--max-model-len", "--max-num-seqs",
                 "--max-num-batched-tokens", "--gpu-memory-utilization", "--enforce-eager", "--dtype",
                 "--block-size", "--host", "--port", "--http-port", "--api-key", "--ssl-keyfile",
                 "--ssl-certfile", "--ssl-ca-certs", "--enable-prefix-caching", "--executor-args",
                 "--scheduler-args", "--executor-port"]:
        assert flag in flags
    for action in actions:
        entry = entries[action.option_strings[0]]
        shown = repr(action.default) if action.default == "" else str(action.default)
        assert entry.endswith(f"(default: {shown})"), entry
        assert len(entry) > len(" ".join(action.option_strings)) + 30, f"no help text: {entry}"
    assert "(default: 8000)" in entries["--http-port"] and "0 = off" in entries["--http-port"]
    assert "--no-enable-prefix-caching" in entries["--enable-prefix-caching"]


def test_dtype_takes_vllms_names_too():
    assert commands(parse_args(["--dtype", "half"]), http_api=False)[0][-2:] == ["--dtype", "float16"]
    assert commands(parse_args(["--dtype", "float"]), http_api=False)[0][-2:] == ["--dtype", "float32"]


@pytest.mark.parametrize("bad", [["--dtype", "int8"], ["--max-num-seqs", "four"], ["--no-such-flag"]])
def test_bad_flags_stop_before_anything_starts(bad):
    with pytest.raises(SystemExit) as err:
        parse_args(bad)
    assert err.value.code == 2


def test_kv_cache_dtype_goes_to_the_executor_and_bad_values_are_refused():
    executor, scheduler = commands(parse_args(["--kv-cache-dtype", "fp8"]), http_api=True)
    assert executor == [*EXECUTOR, "--kv-cache-dtype", "fp8"] and "--kv-cache-dtype" not in scheduler
    assert ExecutorConfig.from_args(executor[3:] + ["--device", "cpu"]).kv_cache_dtype == "fp8"
    with pytest.raises(SystemExit):
        parse_args(["--kv-cache-dtype", "fp8_e5m2"])


def test_speculative_config_goes_to_the_scheduler_as_one_argument():
    spec = '{"method": "ngram", "num_speculative_tokens": 4}'
    executor, scheduler = commands(parse_args(["--speculative-config", spec]), http_api=False)
    i = scheduler.index("--speculative-config")
    assert scheduler[i + 1] == spec and "--speculative-config" not in executor
    assert "--speculative-config" not in commands(parse_args([]), http_api=False)[1]


def test_a_draft_model_config_goes_to_both_services():
    spec = '{"model": "/m/draft", "num_speculative_tokens": 4}'
    executor, scheduler = commands(parse_args(["--speculative-config", spec]), http_api=False)
    assert executor[-2:] == ["--speculative-config", spec]
    assert scheduler[scheduler.index("--speculative-config") + 1] == spec
    assert ExecutorConfig.from_args(executor[3:] + ["--device", "cpu"]).speculative_model == "/m/draft"
    ngram = '{"method": "ngram", "num_speculative_tokens": 4}'
    assert "--speculative-config" not in commands(parse_args(["--speculative-config", ngram]), http_api=False)[0]
    assert "--speculative-config" not in commands(parse_args(["--speculative-config", "{bad"]), http_api=False)[0]


def test_disable_log_requests_reaches_the_scheduler(monkeypatch):
    """vLLM's --disable-log-requests: passed on only when given; the scheduler parses it (also
    from its variable, and the deprecated --no-log-requests / --log-requests spellings)."""
    _, scheduler = commands(parse_args(["--disable-log-requests"]), http_api=False)
    assert scheduler == [*SCHEDULER, "--disable-log-requests"]
    assert "--disable-log-requests" not in commands(parse_args([]), http_api=False)[1]
    for name in [n for n in os.environ if n.startswith("LLMSERVE_")]:
        monkeypatch.delenv(name)
    assert scheduler_from_args(scheduler[3:]).disable_log_requests is True
    assert scheduler_from_args([]).disable_log_requests is False  # the access log is on by default
    assert scheduler_from_args(["--no-log-requests"]).disable_log_requests is True
    assert scheduler_from_args(["--log-requests"]).disable_log_requests is False
    monkeypatch.setenv("LLMSERVE_SCHEDULER_DISABLE_LOG_REQUESTS", "1")
    assert scheduler_from_args([]).disable_log_requests is True


def test_deterministic_reaches_the_executor_only():
    executor, scheduler = commands(parse_args(["--deterministic"]), http_api=False)
    assert executor == [*EXECUTOR, "--deterministic"] and scheduler == SCHEDULER
    assert ExecutorConfig.from_args(executor[3:] + ["--device", "cpu"]).deterministic
