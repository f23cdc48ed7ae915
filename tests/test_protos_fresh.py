"""The committed stubs must be exactly what protos/generate.sh makes from protos/*.proto."""

import filecmp
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_generated_stubs_are_fresh(tmp_path):
    pytest.importorskip("grpc_tools")
    subprocess.run(["bash", str(ROOT / "protos/generate.sh"), str(tmp_path)], check=True)
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*_pb2*.py*"))
    assert len(generated) == 6
    stale = [str(p) for p in generated if not filecmp.cmp(tmp_path / p, ROOT / p, shallow=False)]
    assert not stale, f"stale stubs, run protos/generate.sh: {stale}"


def test_stubs_import_under_installed_grpc():
    from protos.llmserve.executor.v1 import executor_pb2_grpc  # noqa: F401
    from protos.llmserve.v1 import llmserve_pb2_grpc  # noqa: F401
