"""Static checks of deploy/k8s/llmserve.yaml: a replica is one pod with a scheduler and its own
executor on loopback, the executor's port is selected by no Service, probes use grpc.health.v1,
and the Service is headless so that clients balance over the pods (round_robin)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def docs() -> dict:
    yaml = pytest.importorskip("yaml")
    return {d["kind"]: d for d in yaml.safe_load_all((ROOT / "deploy" / "k8s" / "llmserve.yaml").read_text())}


def test_one_pod_is_one_replica_with_both_services(docs):
    dep = docs["Deployment"]
    assert dep["spec"]["replicas"] >= 2
    assert dep["spec"]["selector"]["matchLabels"] == dep["spec"]["template"]["metadata"]["labels"]
    containers = {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}
    assert set(containers) == {"executor", "scheduler"}
    env = {e["name"]: e for e in containers["scheduler"]["env"]}
    assert env["LLMSERVE_SCHEDULER_EXECUTOR_ADDRESS"]["value"] == "127.0.0.1:50061"
    for c in containers.values():  # the shared secret comes from a Secret, never inline
        token = {e["name"]: e for e in c["env"]}["LLMSERVE_INTERNAL_TOKEN"]
        assert token["valueFrom"]["secretKeyRef"] == {"name": "llmserve-internal", "key": "token"}
    assert containers["executor"]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert containers["scheduler"]["readinessProbe"]["grpc"]["port"] == 50051
    assert containers["executor"]["startupProbe"]["grpc"]["port"] == 50061


def test_service_is_headless_grpc_on_the_public_port_only(docs):
    svc = docs["Service"]["spec"]
    assert svc["clusterIP"] == "None"
    assert svc["selector"] == docs["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert [(p["port"], p["targetPort"], p["appProtocol"]) for p in svc["ports"]] == [(50051, "grpc", "grpc")]
