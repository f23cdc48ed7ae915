"""The scheduler image has no torch: importing any scheduler_svc module must not load it."""

import subprocess
import sys
from pathlib import Path

import scheduler_svc

PACKAGE_DIR = Path(scheduler_svc.__file__).parent


def test_no_scheduler_module_imports_torch():
    # Globbed, not listed: a module added later is covered without touching this test.
    modules = sorted(
        "scheduler_svc." + ".".join(p.relative_to(PACKAGE_DIR).with_suffix("").parts)
        for p in PACKAGE_DIR.rglob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert "scheduler_svc.scheduler" in modules
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            "    assert 'torch' not in sys.modules, name + ' imported torch'\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=PACKAGE_DIR.parent)
    assert result.returncode == 0, result.stderr
