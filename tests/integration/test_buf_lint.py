"""Both protos pass `buf lint` with the repository's buf.yaml (Buf's STANDARD rules, the
exceptions it documents). Needs the Buf CLI: $BUF_BIN, `buf` on PATH, or the npm install
at /tmp/buf (`npm install --prefix /tmp/buf @bufbuild/buf`); skipped without one."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NPM_BUF = Path("/tmp/buf/node_modules/.bin/buf")


def _buf() -> str | None:
    if os.environ.get("BUF_BIN"):
        return os.environ["BUF_BIN"]
    on_path = shutil.which("buf")
    if on_path:
        return on_path
    return str(NPM_BUF) if NPM_BUF.exists() else None


def test_protos_pass_buf_lint():
    buf = _buf()
    if buf is None:
        pytest.skip("no Buf CLI: set BUF_BIN, put buf on PATH, or "
                    "`npm install --prefix /tmp/buf @bufbuild/buf`")
    assert (ROOT / "buf.yaml").exists()
    result = subprocess.run([buf, "lint"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"buf lint failed:\n{result.stdout}{result.stderr}"
