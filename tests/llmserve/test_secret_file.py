"""The internal token from a file (llmserve/secret_file.py, --internal-token-file and
LLMSERVE_INTERNAL_TOKEN_FILE on both services): read once at start, a token given directly
wins, and a file that is missing, empty, too large or not a token stops the service with the
flag and the path named (docker-compose.yml's init service writes the file)."""

from __future__ import annotations

import pytest

from executor_svc.config import ExecutorConfig
from scheduler_svc.config import from_args as scheduler_config


def _executor(argv):
    return ExecutorConfig.from_args(["--device", "cpu", *argv])


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "internal-token"
    path.write_text("0f" * 32 + "\n")
    return path


@pytest.fixture(autouse=True)
def no_token_env(monkeypatch):
    for name in ("LLMSERVE_INTERNAL_TOKEN", "LLMSERVE_INTERNAL_TOKEN_FILE", "LLMSERVE_EXECUTOR_INTERNAL_TOKEN",
                 "LLMSERVE_SCHEDULER_INTERNAL_TOKEN", "LLMSERVE_EXECUTOR_INTERNAL_TOKEN_FILE",
                 "LLMSERVE_SCHEDULER_INTERNAL_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("load", [_executor, scheduler_config], ids=["executor", "scheduler"])
def test_the_token_comes_from_the_file_unless_given(load, token_file, monkeypatch):
    assert load(["--internal-token-file", str(token_file)]).internal_token == "0f" * 32
    assert load(["--internal-token-file", str(token_file), "--internal-token", "mine"]).internal_token == "mine"
    monkeypatch.setenv("LLMSERVE_INTERNAL_TOKEN_FILE", str(token_file))  # compose's way
    assert load([]).internal_token == "0f" * 32
    monkeypatch.setenv("LLMSERVE_INTERNAL_TOKEN", "users-own")  # a user's token wins
    assert load([]).internal_token == "users-own"
    monkeypatch.setenv("LLMSERVE_INTERNAL_TOKEN", "")  # compose's ${LLMSERVE_INTERNAL_TOKEN:-} unset
    assert load([]).internal_token == "0f" * 32
    assert "0f" * 32 not in repr(load([]))


@pytest.mark.parametrize("load", [_executor, scheduler_config], ids=["executor", "scheduler"])
@pytest.mark.parametrize("content,why", [(None, "cannot read"), ("", "is empty"), ("  \n", "is empty"),
                                         ("a" * 5000, "over 4096 bytes"), ("two words", "printable ASCII"),
                                         ("tok\u00e9n", "printable ASCII")])
def test_a_bad_token_file_stops_the_service_naming_it(load, tmp_path, content, why):
    path = tmp_path / "internal-token"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as e:
        load(["--internal-token-file", str(path)])
    assert str(e.value).startswith("--internal-token-file: ") and str(path) in str(e.value) and why in str(e.value)
