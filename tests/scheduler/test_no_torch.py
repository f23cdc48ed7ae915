"""The scheduler image has no torch: importing any scheduler_svc module (or the shared step
protocol, or the launcher) must not load it; the scheduler core does not even load grpc."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _modules(package: str) -> list[str]:
    # Globbed, not listed: a module added later is covered without touching this test.
    base = ROOT / package
    return sorted(
        ".".join((package, *p.relative_to(base).with_suffix("").parts))
        for p in base.rglob("*.py") if p.name not in ("__init__.py", "__main__.py"))


def _import_all_without(modules: list[str], forbidden: str) -> subprocess.CompletedProcess:
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            f"    assert {forbidden!r} not in sys.modules, name + ' imported {forbidden}'\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)


def test_no_scheduler_module_imports_torch():
    modules = _modules("scheduler_svc") + _modules("step_protocol") + _modules("llmserve")
    assert "scheduler_svc.core.scheduler" in modules and "step_protocol.codec" in modules
    result = _import_all_without(modules, "torch")
    assert result.returncode == 0, result.stderr


def test_scheduler_core_imports_no_grpc():
    modules = [m.replace("/", ".") for m in _modules("scheduler_svc/core")]
    assert "scheduler_svc.core.scheduler" in modules
    result = _import_all_without(modules + ["step_protocol.domain"], "grpc")
    assert result.returncode == 0, result.stderr
